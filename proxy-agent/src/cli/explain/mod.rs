//! `proxy-agent explain`: what the eBPF datapath does with a packet.
//!
//! The packet runs through the real programs with BPF_PROG_TEST_RUN, never
//! attached and never sent anywhere, against maps programmed either from
//! manifests and a configuration (offline: [`offline`], inside a private
//! network namespace built by [`sandbox`]) or copied from a running agent's
//! pins (online: [`online`]). [`trace`] runs it, [`verdict`] says what that
//! means, [`frontend`] names the service, [`report`] prints it.
//!
//! ```text
//! args -> offline | online -> Datapath -> trace::run -> verdict::classify -> report (text | json)
//! ```

pub mod affinity;
pub mod args;
pub mod frontend;
mod host;
pub mod maglev;
pub(crate) mod offline;
mod online;
pub mod probe;
pub mod report;
pub mod sandbox;
pub mod trace;
pub mod verdict;

use std::process::ExitCode;

use args::{Args, ExplainArgs, Source};

use crate::cli::fail;

/// Runs `proxy-agent explain`: prints the answer on stdout, or one line of
/// error on stderr and exits 1.
pub fn main(args: ExplainArgs) -> ExitCode {
    match run(&args.resolve()) {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(e) => fail(format!("{e:#}")),
    }
}

/// The rendered answer.
pub fn run(args: &Args) -> anyhow::Result<String> {
    args.probe.check().map_err(anyhow::Error::msg)?;
    let (mut datapath, names, mode) = match &args.source {
        Source::Offline(offline) => {
            let (datapath, names) = offline::prepare(offline)?;
            (datapath, names, "offline")
        }
        Source::Online(pins) => {
            let datapath = online::prepare(&pins.dir(), &args.probe)?;
            (datapath, frontend::Names::new(), "online")
        }
    };
    let probe = &args.probe;
    let front = frontend::lookup(&datapath.maps, &names, probe);
    match args.flows {
        None => {
            let trace = trace::run(&mut datapath, probe)?;
            let verdict = verdict::classify(probe, &trace);
            let pin = front
                .as_ref()
                .and_then(|f| affinity::read(&datapath.maps, f, probe, &trace));
            let report = report::Single::new(mode, probe, front.as_ref(), &trace, &verdict)
                .with_affinity(pin)
                .with_maglev(maglev::read(&datapath.maps, probe));
            args.output.render(&report, report::Single::text)
        }
        Some(n) => {
            let mut tally = report::Flows::new(mode, probe, front.as_ref());
            let mut pin = None;
            let mut bucket = None;
            for sport in probe::source_ports(probe.sport, n) {
                let flow = probe.with_sport(sport);
                let trace = trace::run(&mut datapath, &flow)?;
                tally.add(&verdict::classify(&flow, &trace));
                pin = front
                    .as_ref()
                    .and_then(|f| affinity::read(&datapath.maps, f, &flow, &trace));
                bucket = maglev::read(&datapath.maps, &flow);
            }
            let tally = tally.finish().with_affinity(pin).with_maglev(bucket);
            args.output.render(&tally, report::Flows::text)
        }
    }
}
