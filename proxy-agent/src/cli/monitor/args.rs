//! `proxy-agent monitor`'s command line.

use std::{path::PathBuf, time::Duration};

use crate::{
    cli::{
        explain::args::Output,
        inspect::args::{EndpointFilter, ServiceFilter, endpoint_filter, service_filter},
        pins::PinDirArg,
        values::nonempty_path,
    },
    options::ebpf::STATE_DIR,
};

/// Stream the running datapath's decisions as they happen: drops and
/// rejects with their reason, and with --flows every new flow with the
/// endpoint chosen. The programs report only while a monitor runs.
#[derive(Clone, Debug, PartialEq, Eq, clap::Args)]
#[command(
    after_help = "Run it in the agent's network namespace (on a node: the host's). \
                  Several monitors may run at once. Stops on Ctrl-C, --count or --duration.\n\n\
                  Examples:\n  proxy-agent monitor\n  \
                  proxy-agent monitor --flows --service default/web\n  \
                  proxy-agent monitor --address 10.0.0.7 --output json"
)]
pub struct MonitorArgs {
    #[command(flatten)]
    pub pins: PinDirArg,
    /// Where the agent publishes the names of the maps' ids
    #[arg(long, value_name = "DIR", value_parser = nonempty_path, default_value = STATE_DIR)]
    pub state_dir: PathBuf,
    /// Also every new flow (not only drops and rejects)
    #[arg(long)]
    pub flows: bool,
    /// Only events about this service
    /// (NAMESPACE/NAME, or NAMESPACE/NAME:PORT with the port's name or number)
    #[arg(long, value_name = "NS/NAME[:PORT]", value_parser = service_filter)]
    pub service: Option<ServiceFilter>,
    /// Only events where this address (and port) is the source, the
    /// destination, or what either was translated to
    #[arg(long, value_name = "IP[:PORT]", value_parser = endpoint_filter)]
    pub address: Option<EndpointFilter>,
    /// Output format: one line per event, or one JSON object per line
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
    /// Stop after N events
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub count: Option<u64>,
    /// Stop after this long (e.g. 30s, 5m)
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    pub duration: Option<Duration>,
}

fn duration(value: &str) -> Result<Duration, String> {
    humantime::parse_duration(value).map_err(|e| format!("{value:?}: {e}"))
}
