//! Reading a command's TOML config file and parsing the values flags and files share.
//! Every error names the file or the key, so an operator knows what to fix.

use anyhow::{anyhow, bail, Context};
use serde::de::DeserializeOwned;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;
use stoa_types::NodeId;

/// Reads `path` as TOML into `T`; `T` denies unknown keys, so a typo is an error that
/// names the key instead of a setting silently ignored.
pub fn load_file<T: DeserializeOwned + Default>(path: Option<&Path>) -> anyhow::Result<T> {
    let Some(path) = path else { return Ok(T::default()) };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config file {}", path.display()))?;
    toml::from_str(&text).map_err(|e| {
        let msg = e.message().to_string();
        match e.span() {
            Some(span) => {
                let line = text[..span.start].matches('\n').count() + 1;
                anyhow!("config file {} line {line}: {msg}", path.display())
            }
            None => anyhow!("config file {}: {msg}", path.display()),
        }
    })
}

/// Resolves one `host:port` (a name or an address) for the setting `key`.
pub fn addr(key: &str, text: &str) -> anyhow::Result<SocketAddr> {
    let text = text.trim();
    let mut addrs = text
        .to_socket_addrs()
        .map_err(|e| anyhow!("{key}: {text:?} is not a host:port address ({e})"))?;
    addrs.next().ok_or_else(|| anyhow!("{key}: {text:?} resolves to no address"))
}

/// Parses a comma-separated list of `host:port` for the setting `key`.
pub fn addr_list(key: &str, text: &str) -> anyhow::Result<Vec<SocketAddr>> {
    let addrs: Vec<SocketAddr> = text
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| addr(key, s))
        .collect::<anyhow::Result<_>>()?;
    if addrs.is_empty() {
        bail!("{key}: needs at least one host:port address");
    }
    Ok(addrs)
}

/// Parses `1=host:port,2=host:port` for the setting `key`.
pub fn peer_list(key: &str, text: &str) -> anyhow::Result<Vec<(NodeId, SocketAddr)>> {
    text.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|item| {
            let (id, a) = item
                .split_once('=')
                .ok_or_else(|| anyhow!("{key}: {item:?} is not of the form ID=host:port"))?;
            let id: u64 =
                id.trim().parse().map_err(|_| anyhow!("{key}: {id:?} is not a replica id"))?;
            Ok((NodeId(id), addr(key, a)?))
        })
        .collect()
}

/// Takes the flag's value if given, else the file's, else fails naming the setting.
pub fn required<T>(key: &str, flag: Option<T>, file: Option<T>) -> anyhow::Result<T> {
    flag.or(file).ok_or_else(|| anyhow!("missing setting: --{key} (or `{key}` in the config file)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Default, Debug)]
    #[serde(deny_unknown_fields)]
    struct Sample {
        listen: Option<String>,
    }

    #[test]
    fn an_unknown_key_is_named_with_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "listen = \"127.0.0.1:1\"\nlisen = 3\n").unwrap();
        let err = load_file::<Sample>(Some(&path)).unwrap_err().to_string();
        assert!(err.contains("lisen") && err.contains("line 2"), "{err}");
        std::fs::write(&path, "listen = \"127.0.0.1:1\"\n").unwrap();
        let good: Sample = load_file(Some(&path)).unwrap();
        assert_eq!(good.listen.as_deref(), Some("127.0.0.1:1"));
        let missing = load_file::<Sample>(Some(&dir.path().join("none.toml"))).unwrap_err();
        assert!(missing.to_string().contains("cannot read config file"), "{missing}");
    }

    #[test]
    fn lists_parse_and_bad_items_are_named() {
        assert_eq!(addr_list("meta", "127.0.0.1:1,127.0.0.1:2").unwrap().len(), 2);
        let peers = peer_list("peers", "1=127.0.0.1:7100,2=127.0.0.1:7101").unwrap();
        assert_eq!(peers[1].0, NodeId(2));
        assert!(peer_list("peers", "x=127.0.0.1:1").unwrap_err().to_string().contains("peers"));
        assert!(addr_list("meta", "nonsense").unwrap_err().to_string().contains("meta"));
        assert!(addr_list("meta", "").is_err());
        assert!(required::<u8>("id", None, None).unwrap_err().to_string().contains("--id"));
    }
}
