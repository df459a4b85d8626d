// What a sandbox sees of itself through the SDK: its own memory limit and CPUs
// in free, /proc/meminfo, sysinfo, nproc and Python (not the host's), and
// `python` is Python 3 (E2B's own tests call `python`).

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

  // glibc answers SC_PHYS_PAGES from sysinfo(2), which no /proc view can change: envd answers
  // it for every process it starts (internal/sysinfo), as user and as root, and in what a
  // background process starts after its command returned.
  test("os.sysconf('SC_PHYS_PAGES') (sysinfo) shows the sandbox memory limit and agrees with free", async () => {
    const probe =
      "python3 -c 'import os; print(os.sysconf(\"SC_PHYS_PAGES\") * os.sysconf(\"SC_PAGE_SIZE\") >> 20)'; free -m | awk '/^Mem:/{print $2}'"
    for (const user of ['user', 'root']) {
      const r = await sbx.commands.run(probe, { user })
      const [phys, free] = r.stdout.trim().split('\n').map(Number)
      assert.equal(phys, info.memoryMB, `as ${user}: SC_PHYS_PAGES says ${phys} MiB, sandbox memoryMB ${info.memoryMB}`)
      assert.equal(phys, free, `as ${user}: sysinfo says ${phys} MiB, free ${free} MiB`)
    }
    await sbx.commands.run(`(sleep 1; ${probe} > /tmp/phys.out; mv /tmp/phys.out /tmp/phys.done) >/dev/null 2>&1 &`)
    const r = await sbx.commands.run('for i in $(seq 100); do [ -e /tmp/phys.done ] && break; sleep 0.1; done; cat /tmp/phys.done')
    const [phys] = r.stdout.trim().split('\n').map(Number)
    assert.equal(phys, info.memoryMB, `in a background process: SC_PHYS_PAGES says ${phys} MiB`)
  })

  test('no command holds CAP_SYS_PTRACE, not even root', async () => {
    // envd keeps it to answer sysinfo; its children never get it (bit 19).
    const r = await sbx.commands.run("grep -E '^Cap(Inh|Prm|Eff|Amb)' /proc/self/status; cat /proc/1/mem 2>&1 | head -c 200", { user: 'root' })
    for (const line of r.stdout.split('\n').filter((l) => l.startsWith('Cap'))) {
      const mask = BigInt('0x' + line.split(/\s+/)[1])
      assert.equal(mask & (1n << 19n), 0n, `root command: ${line}`)
    }
    assert.match(r.stdout, /Permission denied/, `root read envd's memory: ${r.stdout}`)
    // sudo has envd start the command as root: the same.
    const s = await sbx.commands.run("sudo -n awk '/^CapPrm:/{print $2}' /proc/self/status", { user: 'user' })
    assert.equal(BigInt('0x' + s.stdout.trim()) & (1n << 19n), 0n, `sudo: CapPrm ${s.stdout}`)
  })

  // Not yet: statfs on btrfs ignores qgroup limits, so `df /` shows the sandbox disk pool; the
  // quota itself holds (writes past diskSizeMB fail with EDQUOT).
  test.todo("df / shows the sandbox's diskSizeMB")

  test('python is Python 3', async () => {
    const r = await sbx.commands.run('python --version; python -c "import sys; print(sys.version_info[0])"')
    assert.match(r.stdout, /^Python 3\.\d+\.\d+\n3\n$/)
  })
})
