//! The e2e bench's counts around an endpoint change (`cpu_taken`), read
//! from this process's own threads: the CPU a task last ran on, the run time
//! tasks on given CPUs gained, and the time a process's threads waited for a
//! CPU.

use std::time::Duration;

use crate::bench_cpu_taken::{cpus_of, snapshot, taken, waited};

fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes the timespec only.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// A thread pinned to `cpu` that spins for `spin` of CPU time, then stays (a thread
/// that ended leaves `/proc`, and its times with it) until dropped.
struct Spinner {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Spinner {
    fn start(cpu: usize, spin: Duration) -> (Self, std::sync::mpsc::Receiver<()>) {
        let (stop, stopped) = std::sync::mpsc::channel();
        let (done, spun) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            // SAFETY: a zeroed cpu_set_t is an empty set; `cpu` is below CPU_SETSIZE.
            let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
            unsafe { libc::CPU_SET(cpu, &mut set) };
            // SAFETY: `set` is a valid cpu_set_t of the size passed.
            let pinned = unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) };
            assert_eq!(pinned, 0, "pinning to CPU {cpu}");
            // CPU time, not wall time: the figures hold however busy the CPU is.
            while thread_cpu_time() < spin {
                std::hint::spin_loop();
            }
            let _ = done.send(());
            let _ = stopped.recv();
        });
        let spinner = Spinner {
            stop: Some(stop),
            thread: Some(thread),
        };
        (spinner, spun)
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        self.stop.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn last_cpu_of_this_process() -> usize {
    *cpus_of(std::process::id()).unwrap().last().unwrap()
}

#[test]
fn a_task_is_found_on_the_cpu_it_ran_on_and_its_time_there_counts() {
    let cpu = last_cpu_of_this_process();
    let (spinner, spun) = Spinner::start(cpu, Duration::from_millis(60));
    std::thread::sleep(Duration::from_millis(10));
    let (all, times) = snapshot(&[]);
    let on = all.on(&times, &[cpu]);
    let before = on.read();
    spun.recv().unwrap();
    let gained = taken(&before, &on.read(), &[cpu]);
    drop(spinner);
    assert!(
        gained >= Duration::from_millis(20),
        "a thread that spun on CPU {cpu} counts there: {gained:?}"
    );
}

#[test]
fn no_time_counts_on_cpus_the_tasks_did_not_run_on() {
    let cpus = cpus_of(std::process::id()).unwrap();
    let (all, before) = snapshot(&[]);
    // A CPU no task can be on.
    let none = libc::CPU_SETSIZE as usize - 1;
    assert!(!cpus.contains(&none));
    assert_eq!(taken(&before, &all.read(), &[none]), Duration::ZERO);
}

#[test]
fn two_threads_spinning_on_one_cpu_make_this_process_wait_for_it() {
    let cpu = last_cpu_of_this_process();
    let before = waited(std::process::id());
    let spin = Duration::from_millis(80);
    let spinners = [Spinner::start(cpu, spin), Spinner::start(cpu, spin)];
    for (_, spun) in &spinners {
        spun.recv().unwrap();
    }
    let wait = Duration::from_nanos(waited(std::process::id()).saturating_sub(before));
    drop(spinners);
    // Each waited while the other ran.
    assert!(
        wait >= Duration::from_millis(20),
        "two spinners on CPU {cpu} waited {wait:?} for it"
    );
}
