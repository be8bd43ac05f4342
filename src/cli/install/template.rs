//! The network config as Calico's install-cni renders it: a template
//! (`CNI_NETWORK_CONFIG_FILE`, else `CNI_NETWORK_CONFIG`, else the built-in
//! one) whose `__PLACEHOLDER__`s are replaced as plain text, in a fixed
//! order, by values from the environment; the result must be a JSON
//! object. Unknown placeholders are left as they are (as Calico does).

use serde_json::Value;

/// The built-in template (the Kubernetes datastore, calico-ipam, policy
/// k8s, portmap), used when the environment gives none.
pub const DEFAULT_TEMPLATE: &str = r#"{
  "name": "k8s-pod-network",
  "cniVersion": "0.3.1",
  "plugins": [
    {
      "type": "calico",
      "log_level": "__LOG_LEVEL__",
      "log_file_path": "__LOG_FILE_PATH__",
      "datastore_type": "__DATASTORE_TYPE__",
      "nodename": "__KUBERNETES_NODE_NAME__",
      "mtu": __CNI_MTU__,
      "ipam": {"type": "calico-ipam"},
      "policy": {"type": "k8s"},
      "kubernetes": {"kubeconfig": "__KUBECONFIG_FILEPATH__"}
    },
    {
      "type": "portmap",
      "snat": true,
      "capabilities": {"portMappings": true}
    }
  ]
}
"#;

/// The placeholders, in the order they are replaced, each with what it
/// becomes.
pub type Values = Vec<(&'static str, String)>;

/// The template with every placeholder of `values` replaced, checked to be
/// a JSON object; the text as rendered (what is written) and its value.
pub fn render(template: &str, values: &Values) -> Result<(String, Value), String> {
    let mut text = template.to_string();
    for (placeholder, value) in values {
        text = text.replace(placeholder, value);
    }
    match serde_json::from_str::<Value>(&text) {
        Ok(value) if value.is_object() => Ok((text, value)),
        Ok(_) => Err(format!(
            "the rendered network config is not a JSON object:\n{text}"
        )),
        Err(e) => Err(format!(
            "the rendered network config is not valid JSON ({e}):\n{text}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_replaced_as_text_and_the_result_checked() {
        let values: Values = vec![
            ("__LOG_LEVEL__", "info".into()),
            ("__LOG_FILE_PATH__", "/var/log/calico/cni/cni.log".into()),
            ("__DATASTORE_TYPE__", "kubernetes".into()),
            ("__KUBERNETES_NODE_NAME__", "node-1".into()),
            (
                "__KUBECONFIG_FILEPATH__",
                "/etc/cni/net.d/calico-kubeconfig".into(),
            ),
            ("__CNI_MTU__", "1440".into()),
        ];
        let (_, conf) = render(DEFAULT_TEMPLATE, &values).unwrap();
        assert_eq!(conf["plugins"][0]["mtu"], 1440);
        assert_eq!(conf["plugins"][0]["nodename"], "node-1");
        assert_eq!(
            conf["plugins"][0]["kubernetes"]["kubeconfig"],
            "/etc/cni/net.d/calico-kubeconfig"
        );
        // An MTU that is not a number makes the config invalid: refused.
        let mut bad = values.clone();
        bad[5].1 = "auto".into();
        let e = render(DEFAULT_TEMPLATE, &bad).unwrap_err();
        assert!(e.contains("not valid JSON"), "{e}");
        assert!(
            render("[1]", &values)
                .unwrap_err()
                .contains("not a JSON object")
        );
        // Unknown placeholders stay.
        let (text, _) = render(r#"{"a": "__UNKNOWN__"}"#, &values).unwrap();
        assert!(text.contains("__UNKNOWN__"));
    }
}
