//! The API client from `--kubeconfig` / `--master` / in-cluster config.
//!
//! kube-rs cannot honour all of `clientConnection`:
//! - `contentType`: kube-rs speaks JSON only; protobuf is not supported.
//! - `qps` / `burst`: kube-rs has no client-side rate limiter. The agent makes
//!   three long-running watches; relists are spaced by the watcher backoff.
//!
//! `acceptContentTypes` is likewise JSON only.

use std::path::PathBuf;

use kube::{
    Client, Config,
    config::{KubeConfigOptions, Kubeconfig, KubeconfigError},
};

#[derive(Clone, Debug, Default)]
pub struct ClientOptions {
    pub kubeconfig: Option<PathBuf>,
    pub master: Option<String>,
    pub qps: Option<f32>,
    pub burst: Option<u32>,
    pub content_type: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("reading kubeconfig {path}")]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: KubeconfigError,
    },
    #[error("in-cluster config (neither --kubeconfig nor --master given)")]
    InCluster {
        #[source]
        source: kube::config::InClusterError,
    },
    #[error("invalid --master URL {master:?}")]
    Master {
        master: String,
        #[source]
        source: http::uri::InvalidUri,
    },
    #[error("building the API client")]
    Build {
        #[source]
        source: kube::Error,
    },
}

/// Same precedence as upstream's `clientcmd.BuildConfigFromFlags`: kubeconfig
/// (with `master` overriding its server), else `master` alone, else in-cluster.
pub async fn build_client(opts: &ClientOptions) -> Result<Client, ClientError> {
    let master = opts
        .master
        .as_deref()
        .filter(|m| !m.is_empty())
        .map(|m| {
            m.parse::<http::Uri>()
                .map_err(|source| ClientError::Master {
                    master: m.to_owned(),
                    source,
                })
        })
        .transpose()?;
    let mut config = match (&opts.kubeconfig, master.clone()) {
        (Some(path), _) => {
            let load = async {
                let kubeconfig = Kubeconfig::read_from(path)?;
                Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await
            };
            load.await.map_err(|source| ClientError::Kubeconfig {
                path: path.clone(),
                source,
            })?
        }
        (None, Some(master)) => Config::new(master),
        (None, None) => {
            tracing::warn!(
                "neither --kubeconfig nor --master was specified; using the in-cluster config"
            );
            Config::incluster().map_err(|source| ClientError::InCluster { source })?
        }
    };
    if let Some(master) = master {
        config.cluster_url = master;
    }
    if let Some(ct) = opts
        .content_type
        .as_deref()
        .filter(|ct| !ct.contains("json"))
    {
        tracing::info!(
            content_type = ct,
            "kube-rs speaks JSON only; clientConnection.contentType not honoured"
        );
    }
    if opts.qps.is_some() || opts.burst.is_some() {
        tracing::info!(qps = ?opts.qps, burst = ?opts.burst, "kube-rs has no client-side rate limiter; qps/burst not honoured");
    }
    Client::try_from(config).map_err(|source| ClientError::Build { source })
}
