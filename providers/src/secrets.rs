//! Secret values as Kubernetes mounts them: the key `KEY` of Secret `NAME` is the file
//! `DIR/NAME/KEY`. Values are read when a provider's client is built and never logged.

use std::path::PathBuf;

use crate::ProviderError;

/// Where mounted Secrets live (`--secrets-dir`); none configured refuses every read.
#[derive(Debug, Clone, Default)]
pub struct SecretFiles {
    /// The directory, if any.
    pub dir: Option<PathBuf>,
}

impl SecretFiles {
    /// The value of `key` in Secret `name`, without a trailing newline.
    pub fn read(&self, name: &str, key: &str) -> Result<String, ProviderError> {
        let Some(dir) = &self.dir else {
            return Err(ProviderError::Config(format!(
                "Secret `{name}` is referenced but no secrets directory is configured (--secrets-dir)"
            )));
        };
        // A name or key that could leave the directory is refused, not resolved.
        let safe = |s: &str| !s.is_empty() && !s.contains('/') && s != "." && s != "..";
        if !safe(name) || !safe(key) {
            return Err(ProviderError::Config(format!("Secret reference `{name}`/`{key}` is not a plain name")));
        }
        let path = dir.join(name).join(key);
        let text = std::fs::read_to_string(&path)
            .map_err(|e| ProviderError::Config(format!("reading Secret `{name}` key `{key}`: {e}")))?;
        Ok(text.trim_end_matches(['\n', '\r']).to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_mounted_keys_and_refuses_escapes() {
        let dir = std::env::temp_dir().join(format!("switchyard-secrets-{}", std::process::id()));
        let _ = std::fs::create_dir_all(dir.join("openai"));
        let _ = std::fs::write(dir.join("openai").join("api-key"), "sk-test\n");
        let files = SecretFiles { dir: Some(dir.clone()) };
        assert_eq!(files.read("openai", "api-key").ok().as_deref(), Some("sk-test"));
        assert!(files.read("..", "api-key").is_err());
        assert!(files.read("openai", "missing").is_err());
        assert!(SecretFiles::default().read("openai", "api-key").is_err());
        let _ = std::fs::remove_dir_all(dir);
    }
}
