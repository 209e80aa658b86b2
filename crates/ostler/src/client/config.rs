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

/// Connection flags shared by every client command.
#[derive(Debug, Clone, Default, clap::Args)]
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
        bail!("daemon address {addr:?}: expected host:port");
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
}

impl DaemonSide {
    fn from_config(c: &crate::config::Config) -> Self {
        Self {
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
    resolve_from(args, &DaemonSide::from_config(&cfg))
}

/// Resolution from the daemon's side of the configuration (exposed for tests).
pub fn resolve_from(args: &ConnectArgs, d: &DaemonSide) -> Result<Target> {
    let endpoint = if let Some(a) = &args.addr {
        parse_addr(a)?
    } else if let Some(sock) = &d.unix_socket {
        Endpoint::Unix(sock.clone())
    } else if !d.listen_addr.trim().is_empty() {
        let a = d.listen_addr.trim();
        if d.tls_cert.is_some() && !a.contains("://") {
            parse_addr(&format!("https://{a}"))?
        } else {
            parse_addr(a)?
        }
    } else {
        parse_addr(DEFAULT_ADDR)?
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

fn default_client_name() -> String {
    let user = std::env::var("USER").unwrap_or_default();
    if user.is_empty() {
        "ostler-cli".to_owned()
    } else {
        format!("ostler-cli:{user}")
    }
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
        Ok(())
    }
}
