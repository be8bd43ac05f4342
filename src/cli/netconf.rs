//! The network config an operator subcommand works on: the file named by
//! `--config`, else the first config file of the CNI config directory (as
//! kubelet and containerd pick it); from a list, the `calico` plugin with
//! the list's `name` and `cniVersion` injected, as libcni does.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::cni::NetConf;

/// The CNI config directory when `CNI_CONF_DIR` does not name one.
pub const DEFAULT_CONF_DIR: &str = "/etc/cni/net.d";

/// The extensions libcni loads from a config directory.
const EXTENSIONS: &[&str] = &["conf", "conflist", "json"];

/// The config file to use: `explicit`, else the first file (by name) with
/// a config extension in `CNI_CONF_DIR` or /etc/cni/net.d.
pub fn config_path(
    explicit: Option<&Path>,
    vars: &HashMap<String, String>,
) -> Result<PathBuf, String> {
    if let Some(path) = explicit {
        return Ok(path.to_path_buf());
    }
    let dir = vars
        .get("CNI_CONF_DIR")
        .filter(|d| !d.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_CONF_DIR), PathBuf::from);
    let entries = std::fs::read_dir(&dir).map_err(|e| {
        format!(
            "reading the CNI config directory {}: {e} (name a config with --config)",
            dir.display()
        )
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| EXTENSIONS.contains(&e))
                && !p.is_dir()
        })
        .collect();
    files.sort();
    files.into_iter().next().ok_or_else(|| {
        format!(
            "no network config (.conf, .conflist, .json) in {} (name one with --config)",
            dir.display()
        )
    })
}

/// The `calico` plugin's config in a config file's JSON: a list's plugin
/// of type `calico` with the list's `name` and `cniVersion`, or a single
/// config of that type.
pub fn calico_plugin(document: &Value, path: &Path) -> Result<Value, String> {
    let shown = path.display();
    let object = document
        .as_object()
        .ok_or_else(|| format!("{shown}: the network config is not a JSON object"))?;
    let Some(plugins) = object.get("plugins") else {
        return match object.get("type").and_then(Value::as_str) {
            Some("calico") => Ok(document.clone()),
            Some(other) => Err(format!(
                "{shown}: the network config is of type {other:?}, not \"calico\" (name another with --config)"
            )),
            None => Err(format!("{shown}: the network config has no \"type\"")),
        };
    };
    let plugins = plugins
        .as_array()
        .ok_or_else(|| format!("{shown}: \"plugins\" is not a list"))?;
    let mut plugin = plugins
        .iter()
        .find(|p| p.get("type").and_then(Value::as_str) == Some("calico"))
        .cloned()
        .ok_or_else(|| {
            format!("{shown}: no plugin of type \"calico\" in the list (name another config with --config)")
        })?;
    if let Some(entry) = plugin.as_object_mut() {
        for key in ["name", "cniVersion"] {
            if let Some(value) = object.get(key) {
                entry.insert(key.to_string(), value.clone());
            }
        }
    }
    Ok(plugin)
}

/// Reads the config file and decodes its `calico` plugin's NetConf.
pub fn load(explicit: Option<&Path>, vars: &HashMap<String, String>) -> Result<NetConf, String> {
    let path = config_path(explicit, vars)?;
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("reading the network config {}: {e}", path.display()))?;
    let document: Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: not JSON: {e}", path.display()))?;
    let plugin = calico_plugin(&document, &path)?;
    NetConf::from_value(&plugin).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn picks_the_calico_plugin_of_a_list() {
        let list = json!({"name": "net", "cniVersion": "1.0.0", "plugins": [
            {"type": "portmap"},
            {"type": "calico", "name": "ignored", "datastore_type": "local"},
        ]});
        let plugin = calico_plugin(&list, Path::new("x.conflist")).unwrap();
        assert_eq!(
            plugin,
            json!({"type": "calico", "name": "net", "cniVersion": "1.0.0", "datastore_type": "local"})
        );
        let single = json!({"type": "calico", "name": "n"});
        assert_eq!(calico_plugin(&single, Path::new("x.conf")).unwrap(), single);
        let err =
            calico_plugin(&json!({"plugins": [{"type": "bridge"}]}), Path::new("a")).unwrap_err();
        assert!(err.contains("no plugin of type \"calico\""), "{err}");
        let err = calico_plugin(&json!({"type": "bridge"}), Path::new("a")).unwrap_err();
        assert!(err.contains("not \"calico\""), "{err}");
    }

    #[test]
    fn picks_the_first_config_file_by_name() {
        let dir = std::env::temp_dir().join(format!("calico-cli-netconf-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("00-dir.conf")).unwrap();
        for name in ["20-b.conflist", "10-a.json", "05-notes.txt"] {
            std::fs::write(dir.join(name), "{}").unwrap();
        }
        let vars = HashMap::from([(
            "CNI_CONF_DIR".to_string(),
            dir.to_string_lossy().into_owned(),
        )]);
        assert_eq!(config_path(None, &vars).unwrap(), dir.join("10-a.json"));
        assert_eq!(
            config_path(Some(Path::new("/x.conf")), &vars).unwrap(),
            PathBuf::from("/x.conf")
        );
        std::fs::remove_dir_all(&dir).unwrap();
        let err = config_path(None, &vars).unwrap_err();
        assert!(err.contains("--config"), "{err}");
    }
}
