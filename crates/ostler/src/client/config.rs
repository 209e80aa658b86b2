//! Where the client finds the daemon: address, token, TLS material.
//!
//! The client reads the daemon's own configuration (`crate::config::load`: defaults ->
//! `config.toml` -> `OSTLER_<SECTION>__<KEY>` variables) so that on the daemon's machine
//! `ostler run` needs no flags, and flags (or their `OSTLER_ADDR`-style variables) win:
//! - address: `--addr` / `OSTLER_ADDR`, else `listen.unix_socket` when set, else
//!   `listen.addr` (a wildcard host becomes loopback; `https` when `tls.cert` is set);
//! - token: `--token` / `OSTLER_TOKEN`, `--token-file` / `OSTLER_TOKEN_FILE`, else the
//!   first of `auth.tokens`, else the first token in `auth.token_file` (when readable);
//! - TLS: `--tls-ca` / `OSTLER_TLS_CA`, else the daemon's `tls.cert` (right for a
//!   self-signed certificate); `--tls-cert`/`--tls-key` for mutual TLS.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};

/// Address used when nothing is configured.
pub const DEFAULT_ADDR: &str = crate::config::DEFAULT_ADDR;

/// Connection flags shared by every client command (shown under their own heading).
#[derive(Debug, Clone, Default, clap::Args)]
#[command(next_help_heading = "Connection")]
pub struct ConnectArgs {
    /// Daemon address: `host:port`, `http://host:port`, `https://host:port` or
    /// `unix:///path/to/socket` [default: from the daemon's config, else 127.0.0.1:7433]
    #[arg(long, env = "OSTLER_ADDR", value_name = "ADDR")]
    pub addr: Option<String>,
    /// Bearer token [default: the daemon's first configured token]
    #[arg(
        long,
        env = "OSTLER_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,
    /// Read the bearer token from this file (first non-comment line)
    #[arg(long, env = "OSTLER_TOKEN_FILE", value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// The daemon's config file [default: config.toml in the platform config directory]
    #[arg(long, env = "OSTLER_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// CA certificate (PEM) that signed the daemon's TLS certificate
    #[arg(long, env = "OSTLER_TLS_CA", value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// Client certificate (PEM) for mutual TLS
    #[arg(long, env = "OSTLER_TLS_CERT", value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// Client key (PEM) for mutual TLS
    #[arg(long, env = "OSTLER_TLS_KEY", value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// Server name to verify when it differs from the address host
    #[arg(long, env = "OSTLER_TLS_DOMAIN", value_name = "NAME")]
    pub tls_domain: Option<String>,
    /// Name sent as `x-ostler-client`; recorded as who answered a prompt
    /// [default: USER@HOST:TERMINAL, e.g. alice@laptop:pts/3]
    #[arg(long, env = "OSTLER_CLIENT_NAME", value_name = "NAME")]
    pub client_name: Option<String>,
}

/// Where and how to reach the daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub endpoint: Endpoint,
    pub token: Option<String>,
    pub tls_ca: Option<PathBuf>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub tls_domain: Option<String>,
    pub client_name: String,
    /// Which setting the address came from, for messages (`--addr / OSTLER_ADDR`, ...).
    pub addr_source: String,
}

/// A parsed daemon address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// `http://host:port` or `https://host:port`.
    Tcp {
        uri: String,
        tls: bool,
    },
    Unix(PathBuf),
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Tcp { uri, .. } => f.write_str(uri),
            Endpoint::Unix(p) => write!(f, "unix://{}", p.display()),
        }
    }
}

/// Parse `host:port`, `http(s)://host:port`, `unix:///path` (or `unix:/path`, or a bare
/// absolute path). A wildcard host (`0.0.0.0`, `[::]`) becomes loopback.
pub fn parse_addr(addr: &str) -> Result<Endpoint> {
    let addr = addr.trim();
    if addr.is_empty() {
        bail!("empty daemon address");
    }
    if let Some(path) = addr
        .strip_prefix("unix://")
        .or_else(|| addr.strip_prefix("unix:"))
    {
        if path.is_empty() {
            bail!("daemon address {addr:?}: no socket path");
        }
        return Ok(Endpoint::Unix(PathBuf::from(path)));
    }
    if addr.starts_with('/') {
        return Ok(Endpoint::Unix(PathBuf::from(addr)));
    }
    let (tls, rest) = if let Some(r) = addr.strip_prefix("https://") {
        (true, r)
    } else if let Some(r) = addr.strip_prefix("http://") {
        (false, r)
    } else if let Some(r) = addr.strip_prefix("tcp://") {
        (false, r)
    } else if addr.contains("://") {
        bail!("daemon address {addr:?}: unsupported scheme (use http, https or unix)");
    } else {
        (false, addr)
    };
    let rest = rest.trim_end_matches('/');
    let rest = if let Some(port) = rest.strip_prefix("0.0.0.0:") {
        format!("127.0.0.1:{port}")
    } else if let Some(port) = rest.strip_prefix("[::]:") {
        format!("[::1]:{port}")
    } else {
        rest.to_owned()
    };
    if !rest.contains(':') || rest.ends_with(':') {
        usage!("daemon address {addr:?}: expected host:port");
    }
    let port = rest.rsplit(':').next().unwrap_or_default();
    if port.parse::<u16>().map_or(true, |p| p == 0) {
        usage!("daemon address {addr:?}: {port:?} is not a port (1 to 65535)");
    }
    let scheme = if tls { "https" } else { "http" };
    Ok(Endpoint::Tcp {
        uri: format!("{scheme}://{rest}"),
        tls,
    })
}

/// What the client takes from the daemon's configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DaemonSide {
    pub listen_addr: String,
    pub unix_socket: Option<PathBuf>,
    pub tokens: Vec<String>,
    pub token_file: Option<PathBuf>,
    pub tls_cert: Option<PathBuf>,
    /// Where the daemon's configuration was read from (for messages).
    pub source: String,
}

impl DaemonSide {
    fn from_config(c: &crate::config::Config, source: String) -> Self {
        Self {
            source,
            listen_addr: c.listen.addr.clone(),
            unix_socket: c.listen.unix_socket.clone(),
            tokens: c.auth.tokens.clone(),
            token_file: c.auth.token_file.clone(),
            tls_cert: c.tls.cert.clone(),
        }
    }
}

/// Resolve the target from flags, environment and the daemon's config.
pub fn resolve(args: &ConnectArgs) -> Result<Target> {
    let default_missing =
        args.config.is_none() && crate::config::default_config_file().is_none_or(|f| !f.exists());
    let source = match args
        .config
        .clone()
        .or_else(crate::config::default_config_file)
    {
        Some(f) if !default_missing => format!("{} or OSTLER_LISTEN__* variables", f.display()),
        _ => "OSTLER_LISTEN__* variables".to_owned(),
    };
    let cfg = if default_missing {
        // No config file at all: the defaults and the daemon's environment variables.
        use figment::providers::{Env, Serialized};
        figment::Figment::from(Serialized::defaults(crate::config::Config::default()))
            .merge(Env::prefixed("OSTLER_").split("__").filter(|k| {
                let first = k.as_str().split('.').next().unwrap_or_default();
                ["listen", "auth", "tls"]
                    .iter()
                    .any(|s| first.eq_ignore_ascii_case(s))
            }))
            .extract::<crate::config::Config>()
            .context("reading the daemon's configuration from OSTLER_* variables")?
    } else {
        crate::config::load(args.config.as_deref(), &Default::default())
            .context("reading the daemon's configuration (for its address and token)")?
    };
    let mut daemon = DaemonSide::from_config(&cfg, source);
    let listen_vars = std::env::vars_os().any(|(k, _)| {
        k.to_str()
            .is_some_and(|k| k.to_ascii_uppercase().starts_with("OSTLER_LISTEN__"))
    });
    if default_missing && !listen_vars {
        // Nothing set the address: say it is the built-in default, not a variable.
        daemon.listen_addr.clear();
    }
    resolve_from(args, &daemon)
}

/// Resolution from the daemon's side of the configuration (exposed for tests).
pub fn resolve_from(args: &ConnectArgs, d: &DaemonSide) -> Result<Target> {
    let from_config = |key: &str| {
        if d.source.is_empty() {
            format!("{key} of the daemon's configuration")
        } else {
            format!("{key} in {}", d.source)
        }
    };
    let (endpoint, addr_source) = if let Some(a) = &args.addr {
        (parse_addr(a)?, "--addr / OSTLER_ADDR".to_owned())
    } else if let Some(sock) = &d.unix_socket {
        (
            Endpoint::Unix(sock.clone()),
            from_config("listen.unix_socket"),
        )
    } else if !d.listen_addr.trim().is_empty() {
        let a = d.listen_addr.trim();
        let e = if d.tls_cert.is_some() && !a.contains("://") {
            parse_addr(&format!("https://{a}"))?
        } else {
            parse_addr(a)?
        };
        (e, from_config("listen.addr"))
    } else {
        (parse_addr(DEFAULT_ADDR)?, "the built-in default".to_owned())
    };
    let token = if let Some(t) = &args.token {
        Some(t.trim().to_owned())
    } else if let Some(f) = &args.token_file {
        Some(read_token(f)?)
    } else if let Some(t) = d.tokens.iter().find(|t| !t.trim().is_empty()) {
        Some(t.trim().to_owned())
    } else if let Some(f) = &d.token_file {
        // The daemon's token file may not be readable by this user: then go without.
        read_token(f).ok()
    } else {
        None
    };
    let tls_ca = args.tls_ca.clone().or_else(|| match &endpoint {
        Endpoint::Tcp { tls: true, .. } => d.tls_cert.clone(),
        _ => None,
    });
    Ok(Target {
        endpoint,
        token: token.filter(|t| !t.is_empty()),
        tls_ca,
        tls_cert: args.tls_cert.clone(),
        tls_key: args.tls_key.clone(),
        tls_domain: args.tls_domain.clone(),
        client_name: args.client_name.clone().unwrap_or_else(default_client_name),
        addr_source,
    })
}

fn read_token(path: &Path) -> Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading token file {}", path.display()))?;
    let token = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'));
    match token {
        Some(t) => Ok(t.to_owned()),
        None => bail!("token file {} is empty", path.display()),
    }
}

/// `USER@HOST:TERMINAL` (`alice@laptop:pts/3`); parts that cannot be found are left out
/// (`alice@laptop`, `ostler-cli@laptop` without a user). Only header-safe characters.
pub fn default_client_name() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_default();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_default();
    // The terminal of stdin, else stderr, else stdout (`/dev/pts/3` -> `pts/3`).
    let tty = [0, 2, 1].iter().find_map(|fd| {
        let p = std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()?;
        let p = p.to_string_lossy().into_owned();
        let rest = p.strip_prefix("/dev/")?;
        (rest.starts_with("pts/") || rest.starts_with("tty")).then(|| rest.to_owned())
    });
    client_name_from(&user, &host, tty.as_deref())
}

/// The default client name from its parts (exposed for tests).
pub fn client_name_from(user: &str, host: &str, tty: Option<&str>) -> String {
    let clean = |s: &str| -> String {
        s.trim()
            .chars()
            .filter(|c| c.is_ascii_graphic() && !matches!(c, '@' | ','))
            .take(64)
            .collect()
    };
    let user = clean(user);
    let host = clean(host);
    let mut name = if user.is_empty() {
        "ostler-cli".to_owned()
    } else {
        user
    };
    if !host.is_empty() {
        name.push('@');
        name.push_str(&host);
    }
    if let Some(t) = tty.map(clean).filter(|t| !t.is_empty()) {
        name.push(':');
        name.push_str(&t);
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse() {
        assert_eq!(
            parse_addr("127.0.0.1:9").ok(),
            Some(Endpoint::Tcp {
                uri: "http://127.0.0.1:9".into(),
                tls: false
            })
        );
        assert_eq!(
            parse_addr("https://d.example:443/").ok(),
            Some(Endpoint::Tcp {
                uri: "https://d.example:443".into(),
                tls: true
            })
        );
        assert_eq!(
            parse_addr("0.0.0.0:7433").ok(),
            Some(Endpoint::Tcp {
                uri: "http://127.0.0.1:7433".into(),
                tls: false
            })
        );
        assert_eq!(
            parse_addr("unix:///run/ostler.sock").ok(),
            Some(Endpoint::Unix("/run/ostler.sock".into()))
        );
        assert!(parse_addr("ftp://x:1").is_err());
        assert!(parse_addr("localhost").is_err());
        assert!(parse_addr("").is_err());
    }

    #[test]
    fn flags_beat_config_and_daemon_keys_are_fallbacks() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let tok = dir.path().join("tok");
        std::fs::write(&tok, "# comment\n  s3cret \nother\n")?;
        let d = DaemonSide {
            listen_addr: "0.0.0.0:9000".into(),
            token_file: Some(tok),
            ..Default::default()
        };
        let t = resolve_from(&ConnectArgs::default(), &d)?;
        assert_eq!(t.endpoint.to_string(), "http://127.0.0.1:9000");
        assert_eq!(t.token.as_deref(), Some("s3cret"));

        let args = ConnectArgs {
            addr: Some("unix:///tmp/x.sock".into()),
            token: Some("flag".into()),
            ..Default::default()
        };
        let t = resolve_from(&args, &d)?;
        assert_eq!(t.endpoint, Endpoint::Unix("/tmp/x.sock".into()));
        assert_eq!(t.token.as_deref(), Some("flag"));

        let d = DaemonSide {
            listen_addr: "127.0.0.1:1".into(),
            unix_socket: Some("/run/o.sock".into()),
            tokens: vec!["first".into(), "second".into()],
            ..Default::default()
        };
        let t = resolve_from(&ConnectArgs::default(), &d)?;
        assert_eq!(t.endpoint, Endpoint::Unix("/run/o.sock".into()));
        assert_eq!(t.token.as_deref(), Some("first"));

        let d = DaemonSide {
            listen_addr: "10.0.0.1:7433".into(),
            tls_cert: Some("/etc/ostler/cert.pem".into()),
            ..Default::default()
        };
        let t = resolve_from(&ConnectArgs::default(), &d)?;
        assert_eq!(t.endpoint.to_string(), "https://10.0.0.1:7433");
        assert_eq!(t.tls_ca, Some(PathBuf::from("/etc/ostler/cert.pem")));
        Ok(())
    }

    #[test]
    fn nothing_configured_uses_default() -> Result<()> {
        let t = resolve_from(&ConnectArgs::default(), &DaemonSide::default())?;
        assert_eq!(t.endpoint.to_string(), format!("http://{DEFAULT_ADDR}"));
        assert_eq!(t.token, None);
        assert_eq!(t.addr_source, "the built-in default");
        Ok(())
    }

    #[test]
    fn the_address_source_is_named() -> Result<()> {
        let d = DaemonSide {
            listen_addr: "127.0.0.1:9000".into(),
            source: "/etc/ostler/config.toml".into(),
            ..Default::default()
        };
        let t = resolve_from(&ConnectArgs::default(), &d)?;
        assert_eq!(t.addr_source, "listen.addr in /etc/ostler/config.toml");
        let args = ConnectArgs {
            addr: Some("127.0.0.1:1".into()),
            ..Default::default()
        };
        assert_eq!(resolve_from(&args, &d)?.addr_source, "--addr / OSTLER_ADDR");
        Ok(())
    }

    #[test]
    fn client_names_carry_user_host_and_terminal() {
        assert_eq!(
            client_name_from("alice", "laptop\n", Some("pts/3")),
            "alice@laptop:pts/3"
        );
        assert_eq!(client_name_from("", "box", None), "ostler-cli@box");
        assert_eq!(client_name_from("bob", "", None), "bob");
        assert_eq!(client_name_from("a b", "h\u{7}x", Some("")), "ab@hx");
    }
}
