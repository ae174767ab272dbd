//! The workloads' worker: this bench's binary started with `--worker` on a
//! host (in a namespace of a testbed, or on a real machine over ssh) runs
//! one command per line read on its standard input and answers each with one
//! line, `ok …` or `err …`. It exits at the end of its input, so it goes
//! with the bench whatever ends it.

use std::{
    io::{BufRead as _, BufReader, Write as _},
    net::SocketAddr,
    process::{Child, ChildStdin, ChildStdout, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use super::{
    cpu_taken,
    hosts::Host,
    maps_watch::{self, AgentMaps},
    workloads,
};

/// A worker this bench started, and the line protocol to it.
pub struct Worker {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
    pub place: String,
}

impl Worker {
    /// Starts a worker on `host`; in `cgroup` (a cgroup v2 directory there,
    /// joined before anything else) when given.
    pub fn start(host: &Host, cgroup: Option<&str>, cpu: Option<usize>) -> anyhow::Result<Self> {
        let bench = host.bench_binary()?;
        let mut args = vec!["--worker".to_owned()];
        if let Some(c) = cgroup {
            args.extend(["--cgroup".to_owned(), c.to_owned()]);
        }
        if let Some(cpu) = cpu {
            args.extend(["--cpu".to_owned(), cpu.to_string()]);
        }
        let mut command = host.command(&bench, &args);
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        die_with_this_process(&mut command);
        let mut child = command
            .spawn()
            .with_context(|| format!("starting a worker with {}", host.describe()))?;
        let input = child.stdin.take().expect("piped");
        let output = BufReader::new(child.stdout.take().expect("piped"));
        let mut w = Self {
            child,
            input,
            output,
            place: host.describe(),
        };
        w.ask("hello")
            .with_context(|| format!("the worker {bench} on {}", w.place))?;
        Ok(w)
    }

    /// Sends one command: the rest of its `ok` line.
    pub fn ask(&mut self, command: &str) -> anyhow::Result<String> {
        writeln!(self.input, "{command}")?;
        self.input.flush()?;
        let mut line = String::new();
        if self.output.read_line(&mut line)? == 0 {
            bail!("the worker on {} exited during {command:?}", self.place);
        }
        let line = line.trim_end();
        match line.split_once(' ').unwrap_or((line, "")) {
            ("ok", rest) => Ok(rest.to_owned()),
            ("err", why) => bail!("{command} on {}: {why}", self.place),
            _ => bail!("the worker on {} answered {line:?}", self.place),
        }
    }

    pub fn ask_num(&mut self, command: &str) -> anyhow::Result<f64> {
        let reply = self.ask(command)?;
        reply
            .trim()
            .parse()
            .with_context(|| format!("{command}: not a number: {reply:?}"))
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // The end of its input ends it; a kill for one stuck in a workload.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Local children (the `ip netns exec`, `ssh` or the program itself) are
/// killed when the bench dies, even by a signal it cannot handle.
pub fn die_with_this_process(command: &mut std::process::Command) {
    use std::os::unix::process::CommandExt as _;
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        command.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
}

/// `--worker [--cgroup DIR] [--cpu N]`: serves commands until its input ends.
pub fn main(args: &[String]) -> anyhow::Result<()> {
    for pair in args.chunks(2) {
        match pair {
            [flag, dir] if flag == "--cgroup" => {
                std::fs::write(std::path::Path::new(dir).join("cgroup.procs"), "0")
                    .with_context(|| format!("joining cgroup {dir}"))?
            }
            [flag, cpu] if flag == "--cpu" => {
                let cpu = cpu.parse().context("--cpu: a number")?;
                pin_to(cpu)?;
                let _ = PINNED_CPU.set(cpu);
            }
            _ => bail!("worker: unknown arguments {args:?}"),
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let udp_received = Arc::new(AtomicU64::new(0));
    let stdout = std::io::stdout();
    // The agent whose maps `change` watches, found once (a process's
    // descriptors take a millisecond or two to go through).
    let mut agent_maps: Option<(u32, AgentMaps)> = None;
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let words: Vec<&str> = line.split_whitespace().collect();
        let reply = match run(&words, &stop, &udp_received, &mut agent_maps) {
            Ok(r) => format!("ok {r}"),
            Err(e) => format!("err {}", format!("{e:#}").replace('\n', " ")),
        };
        let mut out = stdout.lock();
        writeln!(out, "{reply}")?;
        out.flush()?;
    }
    stop.store(true, Ordering::Relaxed);
    Ok(())
}

fn addr(s: Option<&&str>) -> anyhow::Result<SocketAddr> {
    s.context("an address is missing")?
        .parse()
        .context("not an address")
}

fn num(s: Option<&&str>) -> anyhow::Result<u64> {
    s.context("a number is missing")?
        .parse()
        .context("not a number")
}

fn run(
    words: &[&str],
    stop: &Arc<AtomicBool>,
    udp: &Arc<AtomicU64>,
    agent_maps: &mut Option<(u32, AgentMaps)>,
) -> anyhow::Result<String> {
    let ms = |i: usize| num(words.get(i)).map(Duration::from_millis);
    Ok(match words.first().copied() {
        Some("hello") => String::new(),
        // serve NAME: the server's listeners, in the background.
        Some("serve") => {
            let name = words.get(1).context("serve NAME")?;
            workloads::serve(name, stop.clone(), udp.clone())?;
            String::new()
        }
        Some("udp-received") => udp.load(Ordering::Relaxed).to_string(),
        // connections ADDR COUNT: elapsed ns, then each latency in ns.
        Some("connections") => {
            let (elapsed, latencies) =
                workloads::connections(addr(words.get(1))?, num(words.get(2))? as usize)?;
            let mut reply = elapsed.as_nanos().to_string();
            for l in latencies {
                reply.push(' ');
                reply.push_str(&l.as_nanos().to_string());
            }
            reply
        }
        Some("bulk") => workloads::bulk(addr(words.get(1))?, ms(2)?)?.to_string(),
        // udp ADDR MS: how long it sent, in ns.
        Some("udp") => workloads::udp(addr(words.get(1))?, ms(2)?)?
            .as_nanos()
            .to_string(),
        // request ADDR TIMEOUT_MS: the server that answered.
        Some("request") => workloads::one_request(addr(words.get(1))?, ms(2)?)?.1,
        // synced METRICS_ADDR TIMEOUT_MS: when the proxy's last sync finished
        // (seconds since the epoch), an error before its first.
        Some("synced") => workloads::last_sync(addr(words.get(1))?, ms(2)?)?.to_string(),
        // sync-age METRICS_ADDR TIMEOUT_MS: seconds since the proxy's last
        // sync finished, by this host's clock (the proxy's).
        Some("sync-age") => {
            let at = workloads::last_sync(addr(words.get(1))?, ms(2)?)?;
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_secs_f64();
            (now - at).to_string()
        }
        // change FROM TO [AGENT_PID FRONTEND BACKEND TIMEOUT_MS]: moves a
        // manifest into place; with an agent, then waits until its maps
        // balance FRONTEND to BACKEND alone: the ns from the move to that,
        // the ns other tasks ran on the agent's CPUs meanwhile and the ns
        // the agent's threads waited for a CPU (`-` when this worker shares
        // them, see [`cpu_taken`]), and the ns counting that took before the
        // move and after the maps changed.
        Some("change") => {
            let (from, to) = (
                words.get(1).context("change FROM TO")?,
                words.get(2).context("change FROM TO")?,
            );
            let watch = match words.get(3) {
                Some(pid) => {
                    let pid: u32 = pid.parse().context("not a pid")?;
                    if agent_maps.as_ref().is_none_or(|(p, _)| *p != pid) {
                        *agent_maps = Some((pid, AgentMaps::of_process(pid)?));
                    }
                    Some((
                        maps_watch::v4(addr(words.get(4))?)?,
                        maps_watch::v4(addr(words.get(5))?)?,
                        ms(6)?,
                    ))
                }
                None => None,
            };
            let Some(((frontend, backend, limit), (pid, maps))) = watch.zip(agent_maps.as_ref())
            else {
                std::fs::rename(from, to).with_context(|| format!("moving {from} to {to}"))?;
                return Ok(String::new());
            };
            // Other tasks' time on the agent's CPUs means something only
            // when this worker (watching the maps) is not on them.
            let agent_cpus = cpu_taken::cpus_of(*pid)?;
            let apart = PINNED_CPU.get().is_some_and(|c| !agent_cpus.contains(c));
            let asked = Instant::now();
            let watched = apart.then(|| {
                let (all, times) = cpu_taken::snapshot(&[*pid, std::process::id()]);
                all.on(&times, &agent_cpus)
            });
            if watched.as_ref().is_some_and(cpu_taken::Tasks::is_empty) {
                bail!("no task was found on the agent's CPUs {agent_cpus:?} (is /proc readable?)");
            }
            let before = watched.as_ref().map(cpu_taken::Tasks::read);
            let waited_before = cpu_taken::waited(*pid);
            let moved = Instant::now();
            std::fs::rename(from, to).with_context(|| format!("moving {from} to {to}"))?;
            let to_maps = maps.wait_serving_only(frontend, backend, moved, limit)?;
            let seen = Instant::now();
            let waited = cpu_taken::waited(*pid).saturating_sub(waited_before);
            let taken = match (watched, before) {
                (Some(watched), Some(before)) => format!(
                    "{} {waited}",
                    cpu_taken::taken(&before, &watched.read(), &agent_cpus).as_nanos()
                ),
                _ => "- -".into(),
            };
            // The time the counts took before the move and after the maps
            // changed: the bench times the change from before this command.
            format!(
                "{} {taken} {} {}",
                to_maps.as_nanos(),
                (moved - asked).as_nanos(),
                seen.elapsed().as_nanos()
            )
        }
        // keep-off PID: every thread of the process PID (an agent on this
        // host) off the CPU this worker is pinned to; the CPUs it may use.
        Some("keep-off") => {
            let pid = num(words.get(1))?;
            let online = online_cpus();
            let away: Vec<usize> = online
                .iter()
                .copied()
                .filter(|c| Some(c) != PINNED_CPU.get())
                .collect();
            let cpus = if away.is_empty() { online } else { away };
            set_process_affinity(pid, &cpus)?;
            format!("{cpus:?}")
        }
        // release PID: every thread of PID back on every CPU.
        Some("release") => {
            set_process_affinity(num(words.get(1))?, &online_cpus())?;
            String::new()
        }
        // reach ADDR SERVER TIMEOUT_MS: one attempt a millisecond until
        // SERVER answers; ns that took.
        Some("reach") => {
            let (target, server, limit) = (addr(words.get(1))?, words.get(2), ms(3)?);
            let server = server.context("reach ADDR SERVER MS")?;
            let t = Instant::now();
            let ask = || workloads::one_request(target, Duration::from_millis(500));
            while !ask().is_ok_and(|(_, s)| s == *server) {
                // Paced: a tight loop of connections (and the servers and
                // softirq it keeps busy) took both CPUs of these VMs from
                // the agent, and the figure measured that (76 ms p50 at
                // 50,000 services unpaced, 5 ms paced).
                std::thread::sleep(Duration::from_millis(1));
                if t.elapsed() > limit {
                    bail!("no connection reached {server} within {limit:?}");
                }
            }
            t.elapsed().as_nanos().to_string()
        }
        // avoid ADDR SERVER STREAK TIMEOUT_MS: until STREAK connections in
        // a row are answered by another server.
        Some("avoid") => {
            let (target, server) = (
                addr(words.get(1))?,
                words.get(2).context("avoid ADDR SERVER STREAK MS")?,
            );
            let (streak_needed, limit) = (num(words.get(3))?, ms(4)?);
            let t = Instant::now();
            let mut streak = 0;
            while streak < streak_needed {
                let other = workloads::one_request(target, Duration::from_millis(500))
                    .is_ok_and(|(_, s)| s != *server);
                streak = if other { streak + 1 } else { 0 };
                if t.elapsed() > limit {
                    bail!("{server} was still reached after {limit:?}");
                }
            }
            String::new()
        }
        Some("softirq") => workloads::softirq_ns()?.to_string(),
        // rss PID: resident memory in KiB.
        Some("rss") => {
            let pid = num(words.get(1))?;
            let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next())
                .context("no VmRSS")?
                .to_owned()
        }
        Some("machine") => machine(),
        other => bail!("unknown command {other:?}"),
    })
}

/// CPUs, their model and the kernel of the host the worker runs on.
fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|l| l.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_default();
    // The machine's, not this pinned worker's share (available_parallelism
    // counts the CPUs the process may run on).
    let cpus = online_cpus().len();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{cpus} CPUs ({cpu}), Linux {}", kernel.trim())
}

/// The CPU `--cpu` pinned this worker to.
static PINNED_CPU: std::sync::OnceLock<usize> = std::sync::OnceLock::new();

fn online_cpus() -> Vec<usize> {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as usize;
    (0..n).collect()
}

/// The set of `cpus`, for sched_setaffinity.
fn cpu_set(cpus: &[usize]) -> anyhow::Result<libc::cpu_set_t> {
    // SAFETY: a zeroed cpu_set_t is an empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        anyhow::ensure!(cpu < libc::CPU_SETSIZE as usize, "CPU {cpu}: no such CPU");
        // SAFETY: `cpu` is below CPU_SETSIZE, within the set.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    Ok(set)
}

/// Every thread of process `pid` (those it starts later inherit it) on `cpus` only.
fn set_process_affinity(pid: u64, cpus: &[usize]) -> anyhow::Result<()> {
    let set = cpu_set(cpus)?;
    let tasks = format!("/proc/{pid}/task");
    for task in std::fs::read_dir(&tasks).with_context(|| format!("reading {tasks}"))? {
        let Some(tid) = task?
            .file_name()
            .to_str()
            .and_then(|t| t.parse::<i32>().ok())
        else {
            continue;
        };
        // SAFETY: `set` is a valid cpu_set_t of the size passed.
        if unsafe { libc::sched_setaffinity(tid, size_of::<libc::cpu_set_t>(), &set) } != 0 {
            let error = std::io::Error::last_os_error();
            // A thread that ended meanwhile.
            if error.raw_os_error() != Some(libc::ESRCH) {
                bail!("setting the CPUs of thread {tid} of {pid}: {error}");
            }
        }
    }
    Ok(())
}

/// Runs this process (and the threads it starts) on `cpu` only.
fn pin_to(cpu: usize) -> anyhow::Result<()> {
    let set = cpu_set(&[cpu])?;
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    if unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) } != 0 {
        bail!("pinning to CPU {cpu}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}
