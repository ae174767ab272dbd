//! The eBPF object, built from `proxy-ebpf` by build.rs and embedded in the binary.

pub static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/proxy-ebpf"));

/// TC ingress of pod-facing interfaces.
pub const PROG_FROM_POD: &str = "tc_from_pod";
/// TC ingress of the node's external interfaces.
pub const PROG_FROM_NETDEV: &str = "tc_from_netdev";
/// XDP on the node's external interfaces.
pub const PROG_XDP: &str = "xdp_from_netdev";
/// TC egress of pod-facing and external interfaces: replies of this node's own sockets.
pub const PROG_FROM_HOST: &str = "tc_from_host";
/// The cgroup programs of socket-level balancing, both families: the
/// socket-address hooks, then [`SOCK_RELEASE`].
pub const SOCKET_PROGRAMS: [&str; 9] = [
    "sock_connect4",
    "sock_sendmsg4",
    "sock_recvmsg4",
    "sock_getpeername4",
    "sock_connect6",
    "sock_sendmsg6",
    "sock_recvmsg6",
    // 15 characters at most: the kernel's name must tell it from getpeername4.
    "sock_peername6",
    SOCK_RELEASE,
];
/// close(2) of a socket (`cgroup/sock_release`): forgets what the hooks kept for it.
pub const SOCK_RELEASE: &str = "sock_release";
