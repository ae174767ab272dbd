use std::path::PathBuf;

use clap::Parser;
use proxy_agent::agent;

/// An eBPF kube-proxy replacement (standalone mode for now).
#[derive(Parser)]
#[command(version)]
struct Cli {
    /// Read Service, EndpointSlice and Node objects from YAML/JSON files in DIR instead of the API server.
    #[arg(long, value_name = "DIR")]
    manifests: PathBuf,
    /// Node name to use instead of the hostname.
    #[arg(long)]
    hostname_override: Option<String>,
    /// Comma-separated name prefixes of host-side pod interfaces to attach to.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "veth,cali,lxc,cni,gke,eni,azv"
    )]
    pod_interface_prefixes: Vec<String>,
}

fn node_name(override_name: Option<String>) -> String {
    override_name
        .filter(|n| !n.trim().is_empty())
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .unwrap_or_default()
        .trim()
        .to_lowercase()
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    use std::io::IsTerminal as _;
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let cli = Cli::parse();
    let settings = agent::Settings {
        manifests_dir: cli.manifests,
        node_name: node_name(cli.hostname_override),
        pod_interface_prefixes: cli.pod_interface_prefixes,
    };
    match agent::run(settings).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
