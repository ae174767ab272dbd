//! How much of the agent's CPUs other tasks took while an endpoint change
//! was timed. These kernels run `PREEMPT_NONE`: a kernel thread (on these
//! VMs `kdamond`, `rcu_preempt`, `kcompactd`, kworkers) that runs for
//! milliseconds holds its CPU for that long, and an agent woken meanwhile
//! (its manifests read, its sync) waits behind it. Traced on this bench's
//! VM (`perf sched`, the agent on CPU 0, the machine otherwise idle),
//! `kdamond` ran up to 5.8 ms at a time there, and a change the agent took
//! 6.8 ms to program had read its file 4 ms late. So each change is given,
//! beside its time, the CPU time other tasks ran on the agent's CPUs during
//! it, from the tasks' `/proc/<pid>/task/<tid>/schedstat`.
//!
//! A task's run time is brought up to date when it leaves its CPU (or at a
//! tick): a task that delayed the agent has left its CPU by the time the
//! agent wrote its maps, so its time is counted. A task is attributed to the
//! CPU it last ran on (`/proc/.../stat`, field 39). Reading every task takes
//! milliseconds (200 tasks on these VMs), longer than most changes, and what
//! ran meanwhile would count: so every task is read once to find those on
//! the agent's CPUs ([`snapshot`], [`Tasks::on`]), and only those are read
//! again just before the move and just after the maps hold it ([`Tasks::read`]).

use std::{collections::HashMap, time::Duration};

/// Each task's run time (ns) and the CPU it last ran on, by thread id.
#[derive(Default)]
pub struct TaskTimes(HashMap<u32, (u64, usize)>);

/// Tasks by process and thread id.
pub struct Tasks(Vec<(u32, u32)>);

/// Every task of this host but those of the processes `skip` (the agent,
/// the worker that reads this), and their times.
pub fn snapshot(skip: &[u32]) -> (Tasks, TaskTimes) {
    let mut tasks = Vec::new();
    let mut times = HashMap::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return (Tasks(tasks), TaskTimes(times));
    };
    for pid in procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
    {
        if skip.contains(&pid) {
            continue;
        }
        let Ok(threads) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue; // ended meanwhile
        };
        for tid in threads
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        {
            if let Some(t) = task_times(pid, tid) {
                tasks.push((pid, tid));
                times.insert(tid, t);
            }
        }
    }
    (Tasks(tasks), TaskTimes(times))
}

impl Tasks {
    /// Those of `times` that last ran on one of `cpus`.
    pub fn on(&self, times: &TaskTimes, cpus: &[usize]) -> Tasks {
        Tasks(
            (self.0.iter())
                .filter(|(_, tid)| times.0.get(tid).is_some_and(|(_, cpu)| cpus.contains(cpu)))
                .copied()
                .collect(),
        )
    }

    /// Their times now (a task that ended is left out).
    pub fn read(&self) -> TaskTimes {
        TaskTimes(
            (self.0.iter())
                .filter_map(|&(pid, tid)| Some((tid, task_times(pid, tid)?)))
                .collect(),
        )
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

fn task_times(pid: u32, tid: u32) -> Option<(u64, usize)> {
    let dir = format!("/proc/{pid}/task/{tid}");
    let schedstat = std::fs::read_to_string(format!("{dir}/schedstat")).ok()?;
    let runtime: u64 = schedstat.split_whitespace().next()?.parse().ok()?;
    let stat = std::fs::read_to_string(format!("{dir}/stat")).ok()?;
    Some((runtime, last_cpu(&stat)?))
}

/// Field 39 (`processor`) of a `stat` line; the command name before it,
/// in parentheses, may hold spaces and parentheses.
fn last_cpu(stat: &str) -> Option<usize> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    // Fields from 3 (`state`) on: field 39 is the 37th.
    after_name.split_whitespace().nth(36)?.parse().ok()
}

/// The run time tasks that last ran on one of `cpus` gained from `before`
/// to `after`.
pub fn taken(before: &TaskTimes, after: &TaskTimes, cpus: &[usize]) -> Duration {
    let ns: u64 = (after.0.iter())
        .filter(|(_, (_, cpu))| cpus.contains(cpu))
        .map(|(tid, (runtime, _))| {
            let earlier = before.0.get(tid).map_or(0, |(r, _)| *r);
            runtime.saturating_sub(earlier)
        })
        .sum();
    Duration::from_nanos(ns)
}

/// The time the threads of process `pid` (the agent) spent runnable but
/// waiting for a CPU, summed, ns (`schedstat`'s second field). Beside
/// [`taken`] it tells a change the machine held the agent off from one where
/// other tasks ran but the agent, woken, preempted them.
pub fn waited(pid: u32) -> u64 {
    let Ok(threads) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    threads
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum()
}

/// The CPUs process `pid` may run on.
pub fn cpus_of(pid: u32) -> anyhow::Result<Vec<usize>> {
    // SAFETY: a zeroed cpu_set_t is a valid (empty) set for the kernel to fill.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    if unsafe { libc::sched_getaffinity(pid as i32, size_of::<libc::cpu_set_t>(), &mut set) } != 0 {
        anyhow::bail!(
            "reading the CPUs of process {pid}: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok((0..libc::CPU_SETSIZE as usize)
        // SAFETY: `cpu` is below CPU_SETSIZE, within the set.
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect())
}
