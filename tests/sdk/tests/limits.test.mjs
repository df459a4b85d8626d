// What a sandbox sees of itself through the SDK: its own memory limit and CPUs
// in free, /proc/meminfo, nproc and Python (not the host's), and `python` is
// Python 3 (E2B's own tests call `python`).

import assert from 'node:assert/strict'
import { before, describe, test } from 'node:test'
import { createSandbox, trackCleanup } from './helpers.mjs'

trackCleanup()

let sbx
let info

describe('limits', { concurrency: true }, () => {
  before(async () => {
    sbx = await createSandbox({ metadata: { file: 'limits' } })
    info = await sbx.getInfo()
  })

  test('free and /proc/meminfo show the sandbox memory limit', async () => {
    const r = await sbx.commands.run(
      "free -m | awk '/^Mem:/{print $2}'; awk '/^MemTotal:/{print int($2/1024)}' /proc/meminfo",
    )
    const [free, meminfo] = r.stdout.trim().split('\n').map(Number)
    assert.ok(Math.abs(free - info.memoryMB) <= 2, `free -m total ${free} MiB, sandbox memoryMB ${info.memoryMB}`)
    assert.ok(Math.abs(meminfo - info.memoryMB) <= 2, `MemTotal ${meminfo} MiB, sandbox memoryMB ${info.memoryMB}`)
  })

  test('nproc and os.cpu_count() show the sandbox CPUs', async () => {
    const r = await sbx.commands.run(
      "nproc; python3 -c 'import os; print(os.cpu_count()); print(len(os.sched_getaffinity(0)))'; grep -c ^processor /proc/cpuinfo",
    )
    const [nproc, cpuCount, affinity, cpuinfo] = r.stdout.trim().split('\n').map(Number)
    // At most the sandbox's cpuCount (fewer only on a host with fewer CPUs), and every tool agrees.
    assert.ok(nproc >= 1 && nproc <= info.cpuCount, `nproc ${nproc}, sandbox cpuCount ${info.cpuCount}`)
    assert.deepEqual([cpuCount, affinity, cpuinfo], [nproc, nproc, nproc], `os.cpu_count, sched_getaffinity, /proc/cpuinfo vs nproc: ${r.stdout}`)
  })

  // Not yet: statfs on btrfs ignores qgroup limits, so `df /` shows the sandbox disk pool; the
  // quota itself holds (writes past diskSizeMB fail with EDQUOT). On the linux runtime,
  // os.sysconf('SC_PHYS_PAGES') (sysinfo(2)) still reports the host's memory.
  test.todo("df / shows the sandbox's diskSizeMB")
  test.todo("os.sysconf('SC_PHYS_PAGES') shows the sandbox memory limit on the linux runtime")

  test('python is Python 3', async () => {
    const r = await sbx.commands.run('python --version; python -c "import sys; print(sys.version_info[0])"')
    assert.match(r.stdout, /^Python 3\.\d+\.\d+\n3\n$/)
  })
})
