//! What user code may reach through the egress proxy (a leaf: the configuration builds it).
//!
//! Two checks, both required: the name asked for is on the allowlist (or any name, with
//! `--allow-network`), and every address it is connected to is a public one: never
//! loopback, link-local (cloud metadata among them), private, shared, multicast or reserved
//! ranges, nor an address of this host. A host the operator names with `--allow-host
//! HOST:PORT` is reached at that port whatever it resolves to.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The operator's egress policy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    /// Any public host (`--allow-network`).
    pub any: bool,
    /// Allowed names, lower-case, without a trailing dot; `*.example.org` allows the names
    /// beneath `example.org` (not `example.org` itself).
    pub domains: Vec<String>,
    /// `(host, port)` pairs allowed whatever their addresses are (`--allow-host`).
    pub hosts: Vec<(String, u16)>,
    /// Domains a caller may add for its own session or run (`--caller-domains`), in the
    /// same form as `domains`.
    pub callers: Vec<String>,
}

/// Most domains a caller may ask for at once.
const MAX_CALLER_DOMAINS: usize = 32;

/// An egress entry refused: the operator's flags, or the domains a caller asks for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EgressError {
    /// Not a domain name (`list`: `--allow-domain`, `--caller-domains` or `allow_domains`).
    #[error("{list}: {value:?} is not a domain name")]
    Domain { list: &'static str, value: String },
    #[error("--allow-host: {value:?} is not HOST:PORT")]
    HostPort { value: String },
    #[error("--allow-host: {value:?}: bad port")]
    Port { value: String },
    /// The caller asked for domains where the operator lets callers add none (`reach`:
    /// what user code may reach anyway, if anything).
    #[error(
        "allow_domains is not accepted by this server: its operator lets callers add no \
         domains (--caller-domains); {}. Leave allow_domains out",
        match .reach {
            Some(r) => format!("user code may reach {r}"),
            None => "user code has no network".to_string(),
        }
    )]
    NoCallerDomains { reach: Option<String> },
    #[error("allow_domains: at most {MAX_CALLER_DOMAINS} domains")]
    TooMany,
    #[error(
        "allow_domains: {name} is not among the domains this server lets callers ask for ({})",
        .callers.join(", ")
    )]
    NotCovered { name: String, callers: Vec<String> },
}

/// A domain entry, normalised, or why it is not one (`list` names where it was given).
fn domain_entry(d: &str, list: &'static str) -> Result<String, EgressError> {
    let name = normalize(d.trim());
    let bare = name.strip_prefix("*.").unwrap_or(&name);
    if bare.is_empty()
        || bare.len() > 253
        || !bare
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == ':')
    {
        return Err(EgressError::Domain {
            list,
            value: d.into(),
        });
    }
    Ok(name)
}

/// Whether `host` is one of `domains` (exactly, or beneath a `*.` entry).
fn matches(domains: &[String], host: &str) -> bool {
    let host = normalize(host);
    domains.iter().any(|d| match d.strip_prefix("*.") {
        Some(parent) => host
            .strip_suffix(parent)
            .is_some_and(|rest| rest.ends_with('.') && rest.len() > 1),
        None => *d == host,
    })
}

/// Normalise a host name for comparison: lower-case, without brackets or a trailing dot.
pub fn normalize(host: &str) -> String {
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .trim_end_matches('.')
        .to_ascii_lowercase()
}

impl Policy {
    /// Build from the operator's lists (`--allow-domain`, `--allow-host`). An entry that is
    /// not a plausible name (or `HOST:PORT`) is an error for the operator.
    pub fn new(
        any: bool,
        domains: &[String],
        hosts: &[String],
        callers: &[String],
    ) -> Result<Self, EgressError> {
        let mut p = Policy {
            any,
            ..Policy::default()
        };
        for (flag, list, into) in [
            ("--allow-domain", domains, &mut p.domains),
            ("--caller-domains", callers, &mut p.callers),
        ] {
            for d in list.iter().map(|d| d.trim()).filter(|d| !d.is_empty()) {
                let name = domain_entry(d, flag)?;
                if !into.contains(&name) {
                    into.push(name);
                }
            }
        }
        for h in hosts.iter().map(|h| h.trim()).filter(|h| !h.is_empty()) {
            let not_host_port = || EgressError::HostPort { value: h.into() };
            let (host, port) = h.rsplit_once(':').ok_or_else(not_host_port)?;
            let port: u16 = port
                .parse()
                .map_err(|_| EgressError::Port { value: h.into() })?;
            let host = normalize(host);
            if host.is_empty() || port == 0 {
                return Err(not_host_port());
            }
            p.hosts.push((host, port));
        }
        Ok(p)
    }

    /// Whether user code may get a way out at all (the proxy runs).
    pub fn enabled(&self) -> bool {
        self.grants_anything() || !self.callers.is_empty()
    }

    /// Whether every run and session gets a way out, without asking.
    pub fn grants_anything(&self) -> bool {
        self.any || !self.domains.is_empty() || !self.hosts.is_empty()
    }

    /// Check the domains a caller asks for (`allow_domains`): each must be one the operator
    /// lets callers ask for (`--caller-domains`: the same entry, or a name it covers).
    /// Returns them normalised.
    pub fn check_caller(&self, asked: &[String]) -> Result<Vec<String>, EgressError> {
        if asked.is_empty() {
            return Ok(Vec::new());
        }
        if self.callers.is_empty() {
            return Err(EgressError::NoCallerDomains {
                reach: self.grants_anything().then(|| self.describe()),
            });
        }
        if asked.len() > MAX_CALLER_DOMAINS {
            return Err(EgressError::TooMany);
        }
        let mut out = Vec::new();
        for d in asked {
            let name = domain_entry(d, "allow_domains")?;
            let covered = self.callers.contains(&name)
                || (!name.starts_with("*.") && matches(&self.callers, &name));
            if !covered {
                return Err(EgressError::NotCovered {
                    name,
                    callers: self.callers.clone(),
                });
            }
            if !out.contains(&name) {
                out.push(name);
            }
        }
        Ok(out)
    }

    /// This policy with a caller's (checked) domains added.
    pub fn with_domains(&self, extra: &[String]) -> Policy {
        let mut p = self.clone();
        for d in extra {
            if !p.domains.contains(d) {
                p.domains.push(d.clone());
            }
        }
        p
    }

    /// The operator named this host and port (`--allow-host`): reached whatever it
    /// resolves to.
    pub fn named_host(&self, host: &str, port: u16) -> bool {
        let host = normalize(host);
        self.hosts.iter().any(|(h, p)| *h == host && *p == port)
    }

    /// Whether the name may be asked for at all (its addresses are checked after).
    pub fn name_allowed(&self, host: &str, port: u16) -> bool {
        if self.any || self.named_host(host, port) {
            return true;
        }
        matches(&self.domains, host)
    }

    /// What the allowlist is, for messages.
    pub fn describe(&self) -> String {
        let mut parts: Vec<String> = Vec::new();
        if self.any {
            parts.push("any public host".into());
        }
        parts.extend(self.domains.iter().cloned());
        parts.extend(self.hosts.iter().map(|(h, p)| format!("{h}:{p}")));
        parts.join(", ")
    }
}

/// Whether an address may be connected to: a public unicast address that is none of this
/// host's own (`own`).
pub fn public_address(ip: IpAddr, own: &[IpAddr]) -> bool {
    let ip = match ip {
        // An IPv4 address written as IPv6 is judged as IPv4.
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    };
    if own.contains(&ip) {
        return false;
    }
    match ip {
        IpAddr::V4(v4) => public_v4(v4),
        IpAddr::V6(v6) => public_v6(v6),
    }
}

fn public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local() // 169.254/16: cloud metadata (169.254.169.254) among them
        || ip.is_broadcast()
        || ip.is_multicast()
        || a == 0
        || (a == 100 && (b & 0xc0) == 64) // shared address space 100.64/10
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 198 && (b & 0xfe) == 18) // benchmarking 198.18/15
        || a >= 240) // reserved
}

fn public_v6(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    // NAT64 (64:ff9b::/96) and IPv4-compatible addresses carry an IPv4 address.
    if (s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0; 4]) || s[..6] == [0; 6] {
        let v4 = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
        if s[..6] == [0; 6] && (ip.is_loopback() || ip.is_unspecified()) {
            return false;
        }
        return public_v4(v4);
    }
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        || (s[0] & 0xfe00) == 0xfc00 // unique local fc00::/7: fd00:ec2::254 among them
        || (s[0] & 0xffc0) == 0xfe80 // link-local
        || (s[0] & 0xffc0) == 0xfec0 // site-local (deprecated)
        || (s[0] == 0x2001 && s[1] < 0x200)) // IETF protocol assignments (Teredo, ...)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("address")
    }

    #[test]
    fn private_loopback_and_metadata_addresses_are_refused() {
        for bad in [
            "127.0.0.1",
            "127.1.2.3",
            "0.0.0.0",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "224.0.0.1",
            "255.255.255.255",
            "240.0.0.1",
            "198.18.0.1",
            "::1",
            "::",
            "fd00:ec2::254",
            "fc00::1",
            "fe80::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::ffff:10.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "::127.0.0.1",
        ] {
            assert!(!public_address(ip(bad), &[]), "{bad} allowed");
        }
        for good in [
            "151.101.0.223",
            "8.8.8.8",
            "172.32.0.1",
            "2a04:4e42::223",
            "::ffff:151.101.0.223",
        ] {
            assert!(public_address(ip(good), &[]), "{good} refused");
        }
        // This host's own public address is refused too.
        assert!(!public_address(ip("151.101.0.223"), &[ip("151.101.0.223")]));
        assert!(!public_address(
            ip("::ffff:151.101.0.223"),
            &[ip("151.101.0.223")]
        ));
    }

    #[test]
    fn names_match_exactly_or_beneath_a_wildcard() {
        let p = Policy::new(
            false,
            &["PyPI.org.".into(), "*.pythonhosted.org".into()],
            &["db.internal:5432".into()],
            &[],
        )
        .expect("policy");
        assert!(p.enabled());
        assert!(p.name_allowed("pypi.org", 443));
        assert!(p.name_allowed("PYPI.ORG.", 443));
        assert!(p.name_allowed("files.pythonhosted.org", 443));
        assert!(!p.name_allowed("pythonhosted.org", 443));
        assert!(!p.name_allowed("evilpythonhosted.org", 443));
        assert!(!p.name_allowed("pypi.org.evil.com", 443));
        assert!(!p.name_allowed("example.com", 443));
        assert!(p.name_allowed("db.internal", 5432));
        assert!(!p.name_allowed("db.internal", 5433));
        assert!(p.named_host("DB.internal", 5432));
        assert_eq!(
            p.describe(),
            "pypi.org, *.pythonhosted.org, db.internal:5432"
        );
        assert!(!Policy::default().enabled());
        assert!(Policy::new(false, &["a b".into()], &[], &[]).is_err());
        assert!(Policy::new(false, &[], &["host".into()], &[]).is_err());
        assert!(Policy::new(false, &[], &["host:x".into()], &[]).is_err());
        assert!(Policy::new(false, &[], &[], &["a/b".into()]).is_err());
        assert!(
            Policy::new(true, &[], &[], &[])
                .expect("any")
                .name_allowed("x.y", 1)
        );
    }

    #[test]
    fn callers_add_only_domains_the_operator_lets_them() {
        let v = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let none = Policy::new(false, &v(&["pypi.org"]), &[], &[]).expect("policy");
        let e = none.check_caller(&v(&["example.com"])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "allow_domains is not accepted by this server: its operator lets callers add no \
             domains (--caller-domains); user code may reach pypi.org. Leave allow_domains out"
        );
        assert_eq!(none.check_caller(&[]), Ok(Vec::new()));
        let p = Policy::new(
            false,
            &[],
            &[],
            &v(&["*.githubusercontent.com", "pypi.org"]),
        )
        .expect("policy");
        assert!(p.enabled() && !p.grants_anything());
        assert_eq!(
            p.check_caller(&v(&["PyPI.org", "raw.githubusercontent.com"])),
            Ok(v(&["pypi.org", "raw.githubusercontent.com"]))
        );
        assert_eq!(
            p.check_caller(&v(&["*.githubusercontent.com"])),
            Ok(v(&["*.githubusercontent.com"]))
        );
        for bad in [
            &["example.com"][..],
            &["githubusercontent.com"],
            &["*.com"],
            &["*.pypi.org"],
            &["pypi.org/x"],
            &[""],
        ] {
            assert!(p.check_caller(&v(bad)).is_err(), "{bad:?} accepted");
        }
        let many: Vec<String> = (0..40).map(|_| "pypi.org".to_string()).collect();
        assert!(p.check_caller(&many).is_err());
        let with = p.with_domains(&v(&["pypi.org"]));
        assert!(with.name_allowed("pypi.org", 443) && !p.name_allowed("pypi.org", 443));
    }
}
