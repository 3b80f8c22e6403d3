// E2B's documented JavaScript example, unchanged but for the environment.
import { Sandbox } from '@e2b/code-interpreter'

const sbx = await Sandbox.create()
await sbx.runCode('x = 1')
const execution = await sbx.runCode('x += 1; x')
console.log(execution.text)
const result = await sbx.commands.run('echo hi')
console.log(result.stdout.trim())
await sbx.files.write('/home/user/notes.txt', 'hello')
console.log(await sbx.files.read('/home/user/notes.txt'))
await sbx.kill()
