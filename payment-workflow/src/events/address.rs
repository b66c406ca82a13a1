//! Where webhooks may go: an endpoint's URL must be `https` (unless `--webhook-allow-http`), carry no
//! credentials, and name only public addresses (unless `--webhook-allow-private`): never a loopback, private,
//! link-local, multicast or otherwise special one. The rules hold at registration and again at every
//! connection, where the name is resolved anew ([`Guard`], reqwest's resolver), so a name that resolves to
//! `127.0.0.1` or `169.254.169.254` later is refused before anything is sent.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use reqwest::Url;

/// Longest URL accepted.
pub const MAX_URL: usize = 2048;

/// Why a URL is refused: each rule by name, said in the problem's detail.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// Not an absolute URL, or longer than [`MAX_URL`].
    #[error("the url is not an absolute http(s) URL of at most 2048 characters")]
    Malformed,
    /// Not `https` (nor `http` where allowed).
    #[error("the url must use https{0}")]
    Scheme(&'static str),
    /// It carries a user name or password.
    #[error("the url must not carry credentials (user:password@)")]
    Credentials,
    /// An address in a range webhooks may not reach. The text names the range, not the address: for a name,
    /// where it resolves inside someone's network is not the client's to learn.
    #[error(
        "the url's host {host} is or resolves to a {range} address; {range} addresses need --webhook-allow-private"
    )]
    Address {
        /// The host as written.
        host: String,
        /// The address it is or resolves to (for the server's own use; never shown).
        address: IpAddr,
        /// `loopback`, `private`, `link-local`, `multicast`, `unspecified` or `reserved`.
        range: &'static str,
    },
    /// The host's name does not resolve.
    #[error("the url's host {0} does not resolve")]
    Unresolvable(String),
}

impl Refusal {
    /// The rule's short name.
    pub fn rule(&self) -> &'static str {
        match self {
            Self::Malformed => "malformed",
            Self::Scheme(_) => "https_only",
            Self::Credentials => "no_credentials",
            Self::Address { .. } => "public_address_only",
            Self::Unresolvable(_) => "unresolvable",
        }
    }
}

/// The special range `ip` is in, or `None` for a public address.
pub fn special_range(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => v4_range(v4),
        IpAddr::V6(v6) => v6_range(v6),
    }
}

fn v4_range(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    Some(match (a, b) {
        _ if ip.is_loopback() => "loopback",
        (0, _) => "unspecified",
        (10, _) | (192, 168) => "private",
        (172, b) if (16..32).contains(&b) => "private",
        // Shared address space (carrier-grade NAT): private to a provider's network.
        (100, b) if (64..128).contains(&b) => "private",
        (169, 254) => "link-local",
        _ if ip.is_multicast() => "multicast",
        // IETF protocol assignments, documentation, the 6to4 relay anycast, benchmarking, 240/4 and the
        // broadcast address.
        (192, 0) if c == 0 || c == 2 => "reserved",
        (192, 88) if c == 99 => "reserved",
        (198, 18 | 19) | (198, 51) | (203, 0) => {
            if (a, b) == (198, 51) && c != 100 || (a, b) == (203, 0) && c != 113 {
                return None;
            }
            "reserved"
        }
        _ if a >= 240 => "reserved",
        _ => return None,
    })
}

/// The IPv4 address in the 32 bits of `s` from segment `at`.
fn embedded(s: &[u16; 8], at: usize) -> Ipv4Addr {
    let [a, b] = s[at].to_be_bytes();
    let [c, d] = s[at + 1].to_be_bytes();
    Ipv4Addr::new(a, b, c, d)
}

fn v6_range(ip: Ipv6Addr) -> Option<&'static str> {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return v4_range(v4);
    }
    let s = ip.segments();
    // NAT64 (64:ff9b::/96) reaches the IPv4 address in its last 32 bits; 6to4 (2002::/16) the one in its
    // second and third segments: each is what its IPv4 address is.
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return v4_range(embedded(&s, 6));
    }
    if s[0] == 0x2002 {
        return v4_range(embedded(&s, 1));
    }
    Some(match s[0] {
        _ if ip.is_loopback() => "loopback",
        _ if ip.is_unspecified() => "unspecified",
        x if x & 0xfe00 == 0xfc00 => "private",
        x if x & 0xffc0 == 0xfec0 => "private",
        x if x & 0xffc0 == 0xfe80 => "link-local",
        x if x & 0xff00 == 0xff00 => "multicast",
        // NAT64 for local use (64:ff9b:1::/48): translates into a network's own IPv4 addresses.
        0x64 if s[1] == 0xff9b && s[2] == 1 => "reserved",
        // Discard-only (100::/64).
        0x100 if s[1..4] == [0, 0, 0] => "reserved",
        // IETF protocol assignments (2001::/23: Teredo, whose server and client addresses are not the
        // destination's, benchmarking, ORCHID) and documentation (2001:db8::/32, 3fff::/20).
        0x2001 if s[1] < 0x200 || s[1] == 0x0db8 => "reserved",
        x if x & 0xfff0 == 0x3ff0 => "reserved",
        // Segment routing SIDs (5f00::/16).
        0x5f00 => "reserved",
        // ::/96 (the deprecated IPv4-compatible form) and the rest of ::/8.
        x if x & 0xff00 == 0 => "reserved",
        _ => return None,
    })
}

/// Resolves a host name to addresses: the system's resolver, or one a test sets.
pub trait Resolver: Send + Sync + 'static {
    /// The addresses of `host`.
    fn lookup(&self, host: &str) -> Pin<Box<dyn Future<Output = std::io::Result<Vec<IpAddr>>> + Send + 'static>>;
}

/// The system's resolver (`getaddrinfo`, through tokio).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

impl Resolver for SystemResolver {
    fn lookup(&self, host: &str) -> Pin<Box<dyn Future<Output = std::io::Result<Vec<IpAddr>>> + Send + 'static>> {
        let host = host.to_owned();
        Box::pin(async move { Ok(tokio::net::lookup_host((host.as_str(), 0)).await?.map(|a| a.ip()).collect()) })
    }
}

/// A resolver answering from a table that can change (tests: a name that resolves differently later).
#[derive(Debug, Clone, Default)]
pub struct TableResolver(Arc<Mutex<std::collections::HashMap<String, Vec<IpAddr>>>>);

impl TableResolver {
    /// `host` resolves to `addresses` from now on.
    pub fn set(&self, host: &str, addresses: Vec<IpAddr>) {
        if let Ok(mut table) = self.0.lock() {
            table.insert(host.to_owned(), addresses);
        }
    }
}

impl Resolver for TableResolver {
    fn lookup(&self, host: &str) -> Pin<Box<dyn Future<Output = std::io::Result<Vec<IpAddr>>> + Send + 'static>> {
        let found = self.0.lock().ok().and_then(|t| t.get(host).cloned());
        Box::pin(async move { found.ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "unknown host")) })
    }
}

/// The rules in force (the server's flags).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rules {
    /// `--webhook-allow-http`.
    pub allow_http: bool,
    /// `--webhook-allow-private`.
    pub allow_private: bool,
}

impl Rules {
    /// The URL's shape: absolute, `https` (or `http` where allowed), no credentials, a host; an address written
    /// as the host must be public (where required). A name is not resolved here.
    pub fn check_shape(&self, raw: &str) -> Result<Url, Refusal> {
        if raw.len() > MAX_URL {
            return Err(Refusal::Malformed);
        }
        let url = Url::parse(raw).map_err(|_| Refusal::Malformed)?;
        match url.scheme() {
            "https" => {}
            "http" if self.allow_http => {}
            "http" => return Err(Refusal::Scheme(" (plain http needs --webhook-allow-http)")),
            _ => return Err(Refusal::Scheme(if self.allow_http { " or http" } else { "" })),
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(Refusal::Credentials);
        }
        let Some(host) = url.host_str() else { return Err(Refusal::Malformed) };
        if let Some(address) = literal(host) {
            self.check_address(host, address)?;
        }
        Ok(url)
    }

    /// Whether `address` (that `host` is or resolves to) may be reached.
    pub fn check_address(&self, host: &str, address: IpAddr) -> Result<(), Refusal> {
        match special_range(address) {
            Some(range) if !self.allow_private => Err(Refusal::Address { host: host.to_owned(), address, range }),
            _ => Ok(()),
        }
    }

    /// The whole check of registration: the shape, then every address a name resolves to now.
    pub async fn check(&self, raw: &str, resolver: &dyn Resolver) -> Result<Url, Refusal> {
        let url = self.check_shape(raw)?;
        let name = url.host_str().unwrap_or_default();
        if literal(name).is_none() {
            let addresses = resolver.lookup(name).await.unwrap_or_default();
            if addresses.is_empty() {
                return Err(Refusal::Unresolvable(name.to_owned()));
            }
            for address in addresses {
                self.check_address(name, address)?;
            }
        }
        Ok(url)
    }
}

/// The address a URL's host is written as (`[…]` for IPv6), if it is one rather than a name. The URL parser has
/// already normalised the other ways of writing one (`2130706433`, `0x7f.1`) to the dotted form.
pub fn literal(host: &str) -> Option<IpAddr> {
    host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host).parse().ok()
}

/// reqwest's resolver for deliveries: resolves through `resolver` and refuses the whole name when any address it
/// resolves to is not allowed (an answer mixing a public and a private address is a rebinding attempt), so the
/// connection is never made.
pub struct Guard {
    /// The resolver.
    pub resolver: Arc<dyn Resolver>,
    /// The rules.
    pub rules: Rules,
}

impl reqwest::dns::Resolve for Guard {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_owned();
        let lookup = self.resolver.lookup(&host);
        let rules = self.rules;
        Box::pin(async move {
            let addresses = lookup.await?;
            for address in &addresses {
                rules.check_address(&host, *address)?;
            }
            let addrs: Vec<SocketAddr> = addresses.into_iter().map(|ip| SocketAddr::new(ip, 0)).collect();
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_ranges_are_named() {
        for (ip, range) in [
            ("127.0.0.1", Some("loopback")),
            ("127.1.2.3", Some("loopback")),
            ("10.1.2.3", Some("private")),
            ("172.16.0.1", Some("private")),
            ("172.32.0.1", None),
            ("192.168.1.1", Some("private")),
            ("100.64.0.1", Some("private")),
            ("169.254.169.254", Some("link-local")),
            ("224.0.0.1", Some("multicast")),
            ("0.0.0.0", Some("unspecified")),
            ("255.255.255.255", Some("reserved")),
            ("93.184.216.34", None),
            ("::1", Some("loopback")),
            ("::", Some("unspecified")),
            ("::ffff:127.0.0.1", Some("loopback")),
            ("::ffff:169.254.169.254", Some("link-local")),
            ("64:ff9b::a9fe:a9fe", Some("link-local")),
            ("fd00::1", Some("private")),
            ("fe80::1", Some("link-local")),
            ("ff02::1", Some("multicast")),
            ("2606:4700::1111", None),
            // IPv6 transition forms that reach an IPv4 address, and ranges not globally reachable.
            ("64:ff9b:1::a00:1", Some("reserved")),
            ("64:ff9b::808:808", None),
            ("2002:a00:1::1", Some("private")),
            ("2002:7f00:1::1", Some("loopback")),
            ("2002:5db8:d822::1", None),
            ("2001::1", Some("reserved")),
            ("2001:0:4136:e378::1", Some("reserved")),
            ("100::1", Some("reserved")),
            ("3fff::1", Some("reserved")),
            ("5f00::1", Some("reserved")),
            ("192.88.99.1", Some("reserved")),
        ] {
            assert_eq!(special_range(ip.parse().unwrap()), range, "{ip}");
        }
    }

    #[tokio::test]
    async fn urls_are_refused_by_rule() {
        let strict = Rules::default();
        let table = TableResolver::default();
        table.set("hooks.example", vec!["93.184.216.34".parse().unwrap()]);
        table.set("inside.example", vec!["93.184.216.34".parse().unwrap(), "127.0.0.1".parse().unwrap()]);
        assert!(strict.check("https://hooks.example/x", &table).await.is_ok());
        let refused = |r: Result<Url, Refusal>| r.unwrap_err().rule();
        assert_eq!(refused(strict.check("http://hooks.example/x", &table).await), "https_only");
        assert_eq!(refused(strict.check("ftp://hooks.example/x", &table).await), "https_only");
        assert_eq!(refused(strict.check("https://u:p@hooks.example/", &table).await), "no_credentials");
        assert_eq!(refused(strict.check("https://127.0.0.1:9/", &table).await), "public_address_only");
        assert_eq!(refused(strict.check("https://[::1]/", &table).await), "public_address_only");
        assert_eq!(refused(strict.check("https://inside.example/", &table).await), "public_address_only");
        assert_eq!(refused(strict.check("https://nowhere.example/", &table).await), "unresolvable");
        assert_eq!(refused(strict.check("not a url", &table).await), "malformed");
        let http = Rules { allow_http: true, allow_private: false };
        let e = http.check("http://169.254.169.254/latest", &table).await.unwrap_err();
        assert!(e.to_string().contains("link-local"), "{e}");
        // A name's refusal says the range, never the address it resolved to.
        table.set("inside.example", vec!["10.1.2.3".parse().unwrap()]);
        let e = strict.check("https://inside.example/", &table).await.unwrap_err();
        assert!(e.to_string().contains("private") && !e.to_string().contains("10.1.2.3"), "{e}");
        let local = Rules { allow_http: true, allow_private: true };
        assert!(local.check("http://127.0.0.1:9/", &table).await.is_ok());
    }
}
