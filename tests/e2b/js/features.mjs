// envs, run_code in Bash and commands.connect through E2B's JavaScript SDK.
import { Sandbox } from '@e2b/code-interpreter'

const WAITER = 'python3 -c "import os,time; ' +
  "[time.sleep(0.05) for _ in iter(lambda: os.path.exists('go'), True)]; " +
  "print('after',flush=True); raise SystemExit(3)\""

const sbx = await Sandbox.create({ envs: { FOO: 'sandbox foo' } })
try {
  console.log((await sbx.commands.run('printenv FOO')).stdout.trim())
  console.log((await sbx.commands.run('printenv FOO', { envs: { FOO: 'mine' } })).stdout.trim())
  console.log((await sbx.runCode("__import__('os').environ['FOO']", { envs: { FOO: 'cell' } })).text)
  const bash = await sbx.runCode('echo "$FOO"', { language: 'bash' })
  console.log(bash.logs.stdout.join('').trim())
  const started = await sbx.commands.run(WAITER, { background: true })
  const attached = await sbx.commands.connect(started.pid)
  await sbx.files.write('/home/user/go', '')
  try {
    await attached.wait()
    console.log('exit 0')
  } catch (e) {
    console.log(`exit ${e.exitCode} ${e.stdout.trim()}`)
  }
} finally {
  await sbx.kill()
}
