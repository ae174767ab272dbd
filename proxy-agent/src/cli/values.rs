//! Value parsers for the subcommands' flags. Each refuses with a reason
//! that reads after the flag's name: `--dport: "0" is not a port (1-65535)`.

use std::{
    net::{IpAddr, Ipv4Addr},
    path::PathBuf,
};

/// An IPv4 address (surrounding blanks ignored).
pub fn ipv4(value: &str) -> Result<Ipv4Addr, String> {
    value
        .trim()
        .parse()
        .map_err(|_| format!("{value:?} is not an IPv4 address"))
}

/// An IPv4 or IPv6 address (surrounding blanks ignored).
pub fn ip(value: &str) -> Result<IpAddr, String> {
    value
        .trim()
        .parse()
        .map_err(|_| format!("{value:?} is not an IPv4 or IPv6 address"))
}

/// A TCP or UDP port, 1 to 65535.
pub fn port(value: &str) -> Result<u16, String> {
    match value.trim().parse::<u16>() {
        Ok(p) if p != 0 => Ok(p),
        _ => Err(format!("{value:?} is not a port (1-65535)")),
    }
}

/// Any path but the empty one.
pub fn nonempty_path(value: &str) -> Result<PathBuf, String> {
    if value.is_empty() {
        return Err("must not be empty".into());
    }
    Ok(PathBuf::from(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_follow_the_flag_name() {
        assert_eq!(ipv4(" 192.0.2.1 "), Ok(Ipv4Addr::new(192, 0, 2, 1)));
        assert_eq!(
            ipv4("1.2.3"),
            Err("\"1.2.3\" is not an IPv4 address".into())
        );
        assert_eq!(port("65535"), Ok(65_535));
        for bad in ["0", "65536", "x", ""] {
            assert_eq!(port(bad), Err(format!("{bad:?} is not a port (1-65535)")));
        }
        assert_eq!(nonempty_path(""), Err("must not be empty".into()));
    }
}
