// The session's JavaScript/TypeScript kernel: one persistent node process, forked and
// confined by the runner (sandboxd_runner/js_kernel.py says how and why).
//
// Its loop: read a request (4-byte length + JSON) on fd 3 with a blocking read on the main
// thread (so the event loop, and any code of the user's, stands still while it waits: the
// runner proves it parked there from /proc), run the code, answer one `v` frame on fd 4
// (status byte + the value's JSON). stdout/stderr are fds 1 and 2 (synchronous pipes: the
// order they were written in); display items are `d` frames on fd 5, each acknowledged by the
// runner on fd 6 before display() returns (so output printed after an item comes after it).
//
// The code runs in one vm context kept for the kernel's life. Each call is rewritten (acorn's
// parse, edits that keep every line where it was): top-level let/const/var/class/function
// and imports become globals of the context (declared again by a later call without an error,
// as in a notebook), the body runs in an async function (top-level await), and a last
// expression statement is its value. TypeScript is transpiled first (Debian's typescript,
// loaded on the first TypeScript call). The module rule (the policy's allow/deny) is checked
// by the context's require(); it is a convenience layer in the same process as the user's
// code, and the container (non-root, no network, no exec but node, limits) holds without it.
'use strict';

const fs = require('fs');
const path = require('path');
const util = require('util');
const vm = require('vm');
const { Console } = require('console');
const acorn = require('acorn');

const CTL = 3, REP = 4, DISP = 5, ACK = 6;
const FILE = '<code>';
const MAX_VALUE_JSON = Number(process.argv[2]) || 1048576;
const MAX_MESSAGE = 1000;
const ACK_WAIT_MS = 2000;
const ROOTS = [process.cwd(), '/tmp'];
const sleeper = new Int32Array(new SharedArrayBuffer(4));
const writeSync = fs.writeSync, readSync = fs.readSync;

function readExactly(n) {
  const buf = Buffer.alloc(n);
  for (let off = 0; off < n;) {
    let got;
    try { got = readSync(CTL, buf, off, n - off, null); } catch (e) {
      if (e.code === 'EAGAIN' || e.code === 'EINTR') continue;
      throw e;
    }
    if (got === 0) process.exit(0); // the runner closed the request pipe
    off += got;
  }
  return buf;
}

function writeAll(fd, buf) {
  for (let off = 0; off < buf.length;) {
    try { off += writeSync(fd, buf, off, buf.length - off); } catch (e) {
      if (e.code !== 'EAGAIN' && e.code !== 'EINTR') throw e;
      Atomics.wait(sleeper, 0, 0, 1);
    }
  }
}

function frame(kind, payload) {
  const head = Buffer.alloc(9);
  head.write(kind, 0, 'latin1');
  head.writeUInt32BE(0, 1);
  head.writeUInt32BE(payload.length, 5);
  return Buffer.concat([head, payload]);
}

// ------------------------------------------------------------------ values and displays

function jsonSafe(value, depth = 0) {
  if (depth > 100) return false;
  if (value === null || typeof value === 'string' || typeof value === 'boolean') return true;
  if (typeof value === 'number') return Number.isFinite(value);
  if (Array.isArray(value)) return value.every((v) => jsonSafe(v, depth + 1));
  if (typeof value !== 'object') return false;
  const proto = Object.getPrototypeOf(value);
  if (proto !== null && Object.getPrototypeOf(proto) !== null) return false; // plain only
  if (proto !== null && proto.constructor && proto.constructor.name !== 'Object') return false;
  return Object.values(value).every((v) => jsonSafe(v, depth + 1));
}

function shown(value) {
  return util.inspect(value, { depth: 4, maxArrayLength: 100, breakLength: 100 });
}

function valueJson(value) {
  let data;
  try {
    // value_repr: the value as JavaScript shows it (`'ab'`, `true`, `{ a: 1 }`)
    data = jsonSafe(value) ? JSON.stringify({ value, value_repr: shown(value) })
      : JSON.stringify({ value: shown(value) });
    if (Buffer.byteLength(data) > MAX_VALUE_JSON && jsonSafe(value)) data = JSON.stringify({ value });
  } catch (e) {
    data = '{"value": "<unrepresentable>"}';
  }
  let buf = Buffer.from(data, 'utf8');
  if (buf.length > MAX_VALUE_JSON) buf = Buffer.from(JSON.stringify({ value: shown(value).slice(0, MAX_VALUE_JSON / 4) }));
  return buf;
}

const MIME = ['text/plain', 'text/html', 'text/markdown', 'image/svg+xml', 'image/png',
  'image/jpeg', 'application/json'];
const DISPLAY_SYMBOL = Symbol.for('Jupyter.display');

function bundleOf(obj, raw) {
  let data = null;
  if (raw && obj && typeof obj === 'object') data = obj;
  else if (obj && typeof obj[DISPLAY_SYMBOL] === 'function') data = obj[DISPLAY_SYMBOL]();
  const out = {};
  if (data && typeof data === 'object') {
    for (const mime of MIME) if (mime in data) out[mime] = data[mime];
  }
  if (!('text/plain' in out)) out['text/plain'] = typeof obj === 'string' ? obj : shown(obj);
  if (!data && jsonSafe(obj)) out['application/json'] = obj;
  return out;
}

function makeDisplay(caps) {
  let sent = 0;
  return function display(obj, options) {
    if (sent > caps.count) return;
    const raw = Boolean(options && options.raw);
    let text = JSON.stringify({ data: bundleOf(obj, raw) });
    let payload = Buffer.from(text, 'utf8');
    if (payload.length > caps.item_bytes) {
      const data = bundleOf(obj, raw);
      const mime = Object.keys(data).reduce((a, b) => (String(data[a]).length >= String(data[b]).length ? a : b));
      payload = Buffer.from(JSON.stringify({ cut: { mime, bytes: payload.length } }));
    }
    try { writeAll(DISP, frame('d', payload)); sent += 1; } catch (e) { sent = caps.count + 1; return; }
    if (sent > caps.count) return;
    // wait (bounded) for the runner's acknowledgement: it relays what was printed before
    const until = Date.now() + ACK_WAIT_MS, one = Buffer.alloc(64);
    while (Date.now() < until) {
      try { if (readSync(ACK, one, 0, 64, null) > 0) return; } catch (e) { /* EAGAIN */ }
      Atomics.wait(sleeper, 0, 0, 1);
    }
  };
}

// ------------------------------------------------------------------ modules and files

class ModuleNotAllowed extends Error {}
ModuleNotAllowed.prototype.name = 'ModuleNotAllowed';

function inside(p) {
  const full = path.resolve(p);
  return ROOTS.some((root) => full === root || full.startsWith(root + path.sep));
}

function pathArg(arg) {
  if (typeof arg === 'string') return arg;
  if (Buffer.isBuffer(arg)) return arg.toString();
  if (arg instanceof URL || (arg && typeof arg.href === 'string' && arg.protocol === 'file:')) {
    return new URL(arg.href).pathname;
  }
  return null;
}

const TWO_PATHS = new Set(['rename', 'copyFile', 'link', 'cp', 'symlink']);

function confinedFs(real, seen = new Map()) {
  if (seen.has(real)) return seen.get(real);
  const out = {};
  seen.set(real, out);
  for (const key of Object.keys(real)) {
    const v = real[key];
    if (key === 'promises' && v && typeof v === 'object') { out[key] = confinedFs(v, seen); continue; }
    if (typeof v !== 'function' || /^[A-Z]/.test(key)) { out[key] = v; continue; }
    const base = key.replace(/Sync$/, '');
    out[key] = function (...args) {
      const which = TWO_PATHS.has(base) ? (base === 'symlink' ? [1] : [0, 1]) : [0];
      for (const i of which) {
        const p = pathArg(args[i]);
        if (p !== null && !inside(p)) {
          throw new ModuleNotAllowed(`${key}: '${p}' is outside the workspace (fs may use ` +
            `${ROOTS.join(' and ')} only)`);
        }
      }
      return v.apply(real, args);
    };
  }
  return out;
}

function makeRequire(rules) {
  const realRequire = require('module').createRequire(path.join(process.cwd(), FILE));
  const allow = rules.allow || [], deny = rules.deny || [];
  return function require(name) {
    if (typeof name !== 'string') throw new TypeError('require() takes a module name');
    const bare = name.startsWith('node:') ? name.slice(5) : name;
    if (bare.startsWith('.') || bare.startsWith('/')) {
      const full = path.resolve(process.cwd(), bare);
      if (!inside(full)) throw new ModuleNotAllowed(`module '${name}' is outside the workspace`);
      return realRequire(full);
    }
    const parts = bare.split('/');
    const top = bare.startsWith('@') ? parts.slice(0, 2).join('/') : parts[0];
    const ruled = deny.find((d) => d === bare || d === top);
    if (ruled !== undefined || !(allow.includes('*') || allow.includes(bare) || allow.includes(top))) {
      throw new ModuleNotAllowed(`module '${name}' is not allowed here` +
        (ruled !== undefined ? ` (tools.javascript.modules.deny[${deny.indexOf(ruled)}])` : ''));
    }
    const mod = realRequire(name);
    return top === 'fs' || top === 'fs/promises' ? confinedFs(mod) : mod;
  };
}

// ------------------------------------------------------------------ the context

class ExitRequest extends Error {}
const timers = new Map(); // handle -> its clear function
const state = { current: null };

function tracked(set, clear, once) {
  return (fn, ...rest) => {
    if (typeof fn !== 'function') throw new TypeError('the callback must be a function');
    const handle = set((...a) => { if (once) timers.delete(handle); fn(...a); }, ...rest);
    timers.set(handle, clear);
    return handle;
  };
}

function untrack(clear) {
  return (handle) => { timers.delete(handle); clear(handle); };
}

const denied = (what) => () => { throw new ModuleNotAllowed(`process.${what} is not allowed here`); };
const userProcess = Object.create(process, {
  exit: { value: (code) => { const e = new ExitRequest('exit'); e.exitCode = code === undefined ? 0 : Number(code) | 0; throw e; } },
  abort: { value: denied('abort') },
  binding: { value: denied('binding') },
  _linkedBinding: { value: denied('_linkedBinding') },
  dlopen: { value: denied('dlopen') },
  mainModule: { value: undefined },
});

const context = vm.createContext({});
const contextGlobal = vm.runInContext('globalThis', context);
Object.assign(contextGlobal, {
  console: new Console({ stdout: process.stdout, stderr: process.stderr }),
  process: userProcess,
  Buffer, URL, URLSearchParams, TextEncoder, TextDecoder, AbortController, AbortSignal,
  structuredClone, atob, btoa, performance, queueMicrotask,
  setTimeout: tracked(setTimeout, clearTimeout, true),
  setInterval: tracked(setInterval, clearInterval, false),
  setImmediate: tracked(setImmediate, clearImmediate, true),
  clearTimeout: untrack(clearTimeout),
  clearInterval: untrack(clearInterval),
  clearImmediate: untrack(clearImmediate),
  __sandboxd_default: (m) => (m && m.__esModule ? m.default : m),
});
contextGlobal.global = contextGlobal;

// ------------------------------------------------------------------ the rewrite

let ts = null;

function transpile(code) {
  if (ts === null) ts = require('typescript');
  const out = ts.transpileModule(code, {
    reportDiagnostics: true,
    compilerOptions: { target: ts.ScriptTarget.ES2022, module: ts.ModuleKind.ESNext,
      isolatedModules: true, removeComments: false, preserveValueImports: false,
      sourceMap: true },
  });
  const bad = (out.diagnostics || []).find((d) => d.category === ts.DiagnosticCategory.Error);
  if (bad) {
    const where = bad.file ? bad.file.getLineAndCharacterOfPosition(bad.start) : { line: 0, character: 0 };
    const err = new SyntaxError(ts.flattenDiagnosticMessageText(bad.messageText, '\n'));
    err.loc = { line: where.line + 1, column: where.character };
    throw err;
  }
  return { text: out.outputText, toSource: sourceMapper(out.sourceMapText) };
}

const VLQ = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/';

// A source map's mappings, decoded: for each line of the JavaScript (1-based) the segments
// [column, TypeScript line, TypeScript column] (0-based), so that an error names the line the
// caller wrote (the transpiler drops interfaces, types and blank lines between them).
function sourceMapper(mapText) {
  let mappings = '';
  try { mappings = String(JSON.parse(mapText).mappings || ''); } catch (e) { return null; }
  const lines = [];
  let srcLine = 0, srcCol = 0;
  for (const text of mappings.split(';')) {
    const segments = [];
    let genCol = 0;
    for (const seg of text.split(',')) {
      if (!seg) continue;
      const values = [];
      let value = 0, shift = 0;
      for (const ch of seg) {
        const digit = VLQ.indexOf(ch);
        if (digit < 0) return null;
        value += (digit & 31) << shift;
        if (digit & 32) { shift += 5; continue; }
        values.push(value & 1 ? -(value >>> 1) : value >>> 1);
        value = 0; shift = 0;
      }
      if (values.length < 4) continue;
      genCol += values[0]; srcLine += values[2]; srcCol += values[3];
      segments.push([genCol, srcLine, srcCol]);
    }
    lines.push(segments);
  }
  return (line, column) => {
    const segments = lines[line - 1];
    if (!segments || !segments.length) return null;
    let best = segments[0];
    for (const s of segments) if (s[0] <= column - 1) best = s;
    return { line: best[1] + 1, column: best[2] + 1 + Math.max(0, column - 1 - best[0]) };
  };
}

function names(pattern, out) {
  if (!pattern) return out;
  switch (pattern.type) {
    case 'Identifier': out.push(pattern.name); break;
    case 'ObjectPattern': for (const p of pattern.properties) names(p.type === 'RestElement' ? p.argument : p.value, out); break;
    case 'ArrayPattern': for (const p of pattern.elements) names(p, out); break;
    case 'RestElement': names(pattern.argument, out); break;
    case 'AssignmentPattern': names(pattern.left, out); break;
    default: break;
  }
  return out;
}

function importText(node) {
  const source = `require(${JSON.stringify(node.source.value)})`;
  const parts = [];
  const named = [];
  for (const s of node.specifiers) {
    if (s.type === 'ImportDefaultSpecifier') parts.push(`${s.local.name} = __sandboxd_default(${source})`);
    else if (s.type === 'ImportNamespaceSpecifier') parts.push(`${s.local.name} = ${source}`);
    else named.push(`${s.imported.name !== undefined ? s.imported.name : JSON.stringify(s.imported.value)}: ${s.local.name}`);
  }
  if (named.length) parts.push(`({${named.join(', ')}} = ${source})`);
  if (!parts.length) parts.push(source);
  return `void (${parts.join(', ')});`;
}

// Whether ``node`` awaits at its top level (not inside a function of its own).
function awaits(node) {
  if (!node || typeof node.type !== 'string') return false;
  if (/Function/.test(node.type)) return false;
  if (node.type === 'AwaitExpression' || (node.type === 'ForOfStatement' && node.await)) return true;
  for (const key of Object.keys(node)) {
    const v = node[key];
    if (Array.isArray(v) ? v.some(awaits) : (v && typeof v === 'object' && awaits(v))) return true;
  }
  return false;
}

// The script that runs ``src`` ({text, async}): every line where it was (the prologue is
// line 0), and every column but on a class's line (and, in code that awaits, the last
// expression's line). Declarations become assignments: `let` -> ` ;(` keeps the width.
function rewrite(src) {
  const ast = acorn.parse(src, { ecmaVersion: 'latest', sourceType: 'script',
    allowAwaitOutsideFunction: true, allowReturnOutsideFunction: false,
    allowImportExportEverywhere: true, allowHashBang: true });
  const isAsync = ast.body.some(awaits);
  const hoisted = new Set(), functions = [], edits = [];
  const body = ast.body;
  const last = body[body.length - 1];
  for (const top of body) {
    let node = top;
    if (node.type === 'ExportNamedDeclaration' && node.declaration) {
      edits.push([node.start, node.declaration.start, '']);
      node = node.declaration;
    }
    if (node.type === 'VariableDeclaration') {
      for (const d of node.declarations) names(d.id, []).forEach((n) => hoisted.add(n));
      const width = node.kind.length;
      edits.push([node.start, node.start + width, ' '.repeat(width - 2) + ';(']);
      for (const d of node.declarations) {
        if (d.init === null && node.kind !== 'var') edits.push([d.id.end, d.id.end, ' = undefined']);
      }
      const end = node.declarations[node.declarations.length - 1].end;
      edits.push([end, end, ')']);
    } else if (node.type === 'FunctionDeclaration') {
      hoisted.add(node.id.name);
      functions.push(node.id.name);
    } else if (node.type === 'ClassDeclaration') {
      hoisted.add(node.id.name);
      edits.push([node.start, node.start, `${node.id.name} = `]);
      edits.push([node.end, node.end, ';']);
    } else if (node.type === 'ImportDeclaration') {
      for (const s of node.specifiers) hoisted.add(s.local.name);
      const lines = src.slice(node.start, node.end).split('\n').length - 1;
      edits.push([node.start, node.end, importText(node) + '\n'.repeat(lines)]);
    } else if (isAsync && top === last && node.type === 'ExpressionStatement') {
      // the statement, not its expression: that starts inside parentheses such as `({a})`
      const end = src[node.end - 1] === ';' ? node.end - 1 : node.end;
      edits.push([node.start, node.start, 'return (']);
      edits.push([end, end, ')']);
    }
  }
  let text = src;
  edits.sort((a, b) => b[0] - a[0] || b[1] - a[1]);
  for (const [start, end, insert] of edits) text = text.slice(0, start) + insert + text.slice(end);
  const decl = hoisted.size ? `var ${[...hoisted].join(', ')}; ` : '';
  if (!isAsync) {
    // a script's completion value is its last expression statement's; none: undefined
    const tail = last && last.type === 'ExpressionStatement' ? '' : '\n;void 0';
    return { text: `${decl}\n${text}${tail}`, isAsync };
  }
  const publish = functions.map((f) => `globalThis.${f} = ${f};`).join(' ');
  return { text: `${decl}(async () => { ${publish}\n${text}\n})()`, isAsync };
}

// ------------------------------------------------------------------ errors

function sourceLine(code, line) {
  const lines = code.split('\n');
  return line >= 1 && line <= lines.length ? lines[line - 1] : '';
}

// ``origin``: for TypeScript, the code the caller wrote and the map from the JavaScript's
// (line, column) to its own, so that every position named is one of the caller's lines.
function describe(err, code, origin) {
  const name = err && err.name ? String(err.name) : 'Error';
  const message = err && err.message !== undefined ? String(err.message) : String(err);
  let stack = err && typeof err.stack === 'string' ? err.stack : `${name}: ${message}`;
  let line = null, column = null;
  if (err && err.loc) { line = err.loc.line; column = err.loc.column + 1; }
  const count = code.split('\n').length;
  const frames = stack.split('\n').filter((l) => {
    const m = /<code>:(\d+):/.exec(l);
    return m !== null && Number(m[1]) <= count; // not the wrapper's own call
  });
  if (line === null && frames.length) {
    const m = /<code>:(\d+):(\d+)/.exec(frames[0]);
    if (m) { line = Number(m[1]); column = Number(m[2]); }
  }
  let listed = frames;
  if (origin) {
    const at = (l, c) => origin.at(l, c) || { line: l, column: c };
    if (line !== null) ({ line, column } = at(line, column));
    listed = frames.map((f) => f.replace(/<code>:(\d+):(\d+)/, (_, l, c) => {
      const p = at(Number(l), Number(c));
      return `${FILE}:${p.line}:${p.column}`;
    }));
    code = origin.code;
  }
  const head = `${name}: ${message.replace(/ \(\d+:\d+\)$/, '')}`;
  let text = '';
  if (line !== null) {
    text += `${FILE}:${line}:${column}\n${sourceLine(code, line)}\n${' '.repeat(Math.max(0, column - 1))}^\n\n`;
  }
  text += head + '\n' + listed.map((f) => (f.startsWith('    ') ? f : '    at ' + f.trim())).join('\n');
  return { text: text.replace(/\n*$/, '\n'), message: head.slice(0, MAX_MESSAGE) };
}

// ------------------------------------------------------------------ the loop

process.on('SIGINT', () => { if (state.current) state.current.stop({ interrupted: true }); });
process.on('uncaughtException', (err) => {
  if (state.current && err instanceof ExitRequest) state.current.stop({ exit: err.exitCode });
  else if (state.current) state.current.stop({ error: err });
  else writeSync(2, `${shown(err)}\n`);
});
process.on('unhandledRejection', (err) => {
  try { writeSync(2, `Unhandled promise rejection: ${err && err.stack ? err.stack : shown(err)}\n`); } catch (e) { /* */ }
});

async function runCall(req) {
  let stop;
  const ended = new Promise((resolve) => { stop = resolve; });
  state.current = { stop };
  contextGlobal.require = makeRequire(req.modules || {});
  contextGlobal.display = makeDisplay(req.display);
  let code = String(req.code), toSource = null;
  try {
    if (req.typescript) ({ text: code, toSource } = transpile(code));
    const { text, isAsync } = rewrite(code);
    const script = new vm.Script(text, { filename: FILE, lineOffset: -1 });
    const result = script.runInContext(context, { breakOnSigint: true });
    if (!isAsync) return { value: result, source: code };
    const outcome = await Promise.race([result.then((value) => ({ value }), (error) => ({ error })), ended]);
    return { ...outcome, source: code, toSource };
  } catch (error) {
    if (error && error.code === 'ERR_SCRIPT_EXECUTION_INTERRUPTED') return { interrupted: true };
    return { error, source: code, toSource };
  }
}

async function main() {
  await fs.promises.stat('/'); // the libuv thread pool starts now: the runner counts threads
  for (;;) {
    const size = readExactly(4).readUInt32BE(0);
    const req = JSON.parse(readExactly(size).toString('utf8'));
    await new Promise((resolve) => setImmediate(resolve)); // a stale SIGINT lands here
    // the loop stays alive while the call waits on a promise nothing else keeps pending
    const alive = setInterval(() => {}, 2 ** 30);
    let outcome = await runCall(req);
    clearInterval(alive);
    if (outcome.error instanceof ExitRequest) outcome = { exit: outcome.error.exitCode };
    state.current = null;
    for (const [handle, clear] of timers) clear(handle); // a call's timers end with it
    timers.clear();
    let status = 0, payload = Buffer.alloc(0);
    if (outcome.interrupted) {
      status = 1;
      writeSync(2, 'Interrupted: the call was interrupted (the kernel and its state are kept)\n');
      payload = Buffer.from(JSON.stringify({ message: 'Interrupted' }));
    } else if (outcome.exit !== undefined) {
      status = outcome.exit & 0xff;
      if (status) payload = Buffer.from(JSON.stringify({ message: `process.exit(${status})` }));
    } else if (outcome.error !== undefined) {
      status = 1;
      const { text, message } = describe(outcome.error, outcome.source || String(req.code),
        outcome.toSource ? { code: String(req.code), at: outcome.toSource } : null);
      writeSync(2, text);
      payload = Buffer.from(JSON.stringify({ message }));
    } else if (outcome.value !== undefined) {
      payload = valueJson(outcome.value);
    }
    writeAll(REP, frame('v', Buffer.concat([Buffer.from([status]), payload])));
  }
}

main().catch((err) => { try { writeSync(2, `sandboxd javascript kernel: ${err.stack}\n`); } finally { process.exit(70); } });
