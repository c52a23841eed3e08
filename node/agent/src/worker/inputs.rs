//! What a pod's containers and volumes are made from, read through the API when they are set
//! up: the containers' environment (the Services, `envFrom` and `env` with `valueFrom`), the
//! Secrets and ConfigMaps its volumes name, its projected ServiceAccount tokens, the volumes
//! bound to its claims and the registry credentials of its `imagePullSecrets`.
//!
//! Failures are [`InputError`]s carrying the Kubernetes reason the pod's status shows; a
//! Secret's contents never reach a log, an event or an error.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use skiff_api::Resource;
use skiff_api::api::{
    ConfigMap, Container, EnvFromSource, EnvVar, PersistentVolume, PersistentVolumeClaim, Pod,
    Secret, Service,
};
use skiff_client::Client;
use skiff_client::controller::Informer;
use skiff_image::auth::RegistryAuths;

use crate::volumes::{self, KeyedKind};

/// How long a container start waits for the agent's first list of Services.
const SERVICES_SYNC_WAIT: Duration = Duration::from_secs(30);

/// Why an input of the pod cannot be resolved, by the reason its status shows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum InputError {
    /// A container's configuration (its environment, a field of its spec) cannot be made.
    #[error("{0}")]
    CreateContainerConfigError(String),
    /// A volume's source (Secret, ConfigMap, token) cannot be read.
    #[error("{0}")]
    FailedMount(String),
}

impl InputError {
    /// The Kubernetes reason (`status.reason`, a container's `waiting.reason`).
    pub fn reason(&self) -> &'static str {
        match self {
            InputError::CreateContainerConfigError(_) => "CreateContainerConfigError",
            InputError::FailedMount(_) => "FailedMount",
        }
    }
}

impl From<volumes::VolumeError> for InputError {
    fn from(e: volumes::VolumeError) -> Self {
        InputError::FailedMount(e.to_string())
    }
}

/// The ServiceAccount tokens of projected volumes, by (volume, source), with the Unix time
/// after which they are asked for again (80% of their lifetime, as the kubelet does).
pub(crate) type TokenCache = BTreeMap<(String, usize), (String, i64)>;

/// Reads the inputs of one pod through the API.
pub(crate) struct Resolver<'a> {
    pub client: &'a Client,
    /// Every Service, for the containers' service environment variables.
    pub services: &'a Informer<Service>,
    pub pod: &'a Pod,
    pub uid: &'a str,
    pub pod_ip: Option<IpAddr>,
    pub host_ip: Option<&'a str>,
}

/// Sets `k` in `env`, a later value replacing an earlier one in place.
fn set(env: &mut Vec<(String, String)>, k: String, v: String) {
    match env.iter_mut().find(|(n, _)| *n == k) {
        Some(slot) => slot.1 = v,
        None => env.push((k, v)),
    }
}

fn config_error(message: String) -> InputError {
    InputError::CreateContainerConfigError(message)
}

impl Resolver<'_> {
    /// A Secret of the pod's namespace; `None` when it does not exist.
    async fn secret(&self, name: &str) -> Result<Option<Secret>, String> {
        match self
            .client
            .namespaced::<Secret>(self.pod.namespace())
            .get(name)
            .await
        {
            Ok(s) => Ok(Some(s)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(format!("reading secret \"{name}\": {e}")),
        }
    }

    /// The keys of a Secret or ConfigMap of the pod's namespace; `None` when it does not
    /// exist.
    async fn keyed(
        &self,
        kind: KeyedKind,
        name: &str,
    ) -> Result<Option<volumes::KeyedData>, String> {
        match kind {
            KeyedKind::Secret => Ok(self.secret(name).await?.map(volumes::secret_data)),
            KeyedKind::ConfigMap => match self
                .client
                .namespaced::<ConfigMap>(self.pod.namespace())
                .get(name)
                .await
            {
                Ok(c) => Ok(Some(volumes::config_map_data(c))),
                Err(e) if e.is_not_found() => Ok(None),
                Err(e) => Err(format!("reading configmap \"{name}\": {e}")),
            },
        }
    }

    /// A container's environment as Kubernetes builds it: the Services' variables, every key
    /// of its `envFrom` Secrets and ConfigMaps (with their prefix), then its `env` (values,
    /// the pod's fields, resources, Secret and ConfigMap keys), a later name replacing an
    /// earlier one. The error's message never holds a value.
    pub async fn env(&self, c: &Container) -> Result<Vec<(String, String)>, InputError> {
        // The Services first ([`crate::envvars`]), from the agent's informer once it has
        // listed them (the kubelet refuses to guess as well).
        if tokio::time::timeout(SERVICES_SYNC_WAIT, self.services.wait_synced())
            .await
            .is_err()
        {
            return Err(config_error(
                "services have not yet been read at least once, cannot construct envvars".into(),
            ));
        }
        let links = self
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.enable_service_links)
            .unwrap_or(true);
        let services = self.services.list();
        let mut env: Vec<(String, String)> = crate::envvars::service_env(
            self.pod.namespace(),
            links,
            services.iter().map(|s| s.as_ref()),
        );
        for f in &c.env_from {
            self.add_env_from(&mut env, f).await?;
        }
        for e in &c.env {
            if let Some(value) = self.env_value(c, e).await? {
                set(&mut env, e.name.clone(), value);
            }
        }
        Ok(env)
    }

    /// Adds every key of an `envFrom` Secret or ConfigMap (with its prefix).
    async fn add_env_from(
        &self,
        env: &mut Vec<(String, String)>,
        f: &EnvFromSource,
    ) -> Result<(), InputError> {
        let (kind, name, optional) = match (&f.secret_ref, &f.config_map_ref) {
            (Some(r), _) => (KeyedKind::Secret, &r.name, r.optional),
            (None, Some(r)) => (KeyedKind::ConfigMap, &r.name, r.optional),
            (None, None) => return Ok(()),
        };
        match self.keyed(kind, name).await.map_err(config_error)? {
            Some(data) => {
                for (k, v) in &data {
                    set(
                        env,
                        format!("{}{k}", f.prefix),
                        String::from_utf8_lossy(v).into_owned(),
                    );
                }
                Ok(())
            }
            None if optional == Some(true) => Ok(()),
            None => Err(config_error(format!(
                "{} \"{name}\" not found",
                kind.noun()
            ))),
        }
    }

    /// The value of one `env` entry of container `c`; `None` when it is left out (an
    /// optional key or object that is missing, an unknown source).
    async fn env_value(&self, c: &Container, e: &EnvVar) -> Result<Option<String>, InputError> {
        let Some(from) = &e.value_from else {
            return Ok(Some(e.value.clone()));
        };
        if let Some(f) = &from.field_ref {
            return volumes::pod_field(self.pod, &f.field_path, self.pod_ip, self.host_ip)
                .map(Some)
                .ok_or_else(|| {
                    config_error(format!("fieldRef {:?} is not supported", f.field_path))
                });
        }
        if let Some(r) = &from.resource_field_ref {
            let container = if r.container_name.is_empty() {
                c.name.as_str()
            } else {
                r.container_name.as_str()
            };
            return volumes::resource_value(self.pod, container, &r.resource, r.divisor.as_deref())
                .map(Some)
                .map_err(config_error);
        }
        let Some((kind, name, key, optional)) = from
            .secret_key_ref
            .as_ref()
            .map(|k| (KeyedKind::Secret, &k.name, &k.key, k.optional))
            .or_else(|| {
                from.config_map_key_ref
                    .as_ref()
                    .map(|k| (KeyedKind::ConfigMap, &k.name, &k.key, k.optional))
            })
        else {
            return Ok(None);
        };
        let optional = optional == Some(true);
        match self.keyed(kind, name).await.map_err(config_error)? {
            Some(data) => match data.get(key) {
                Some(v) => Ok(Some(String::from_utf8_lossy(v).into_owned())),
                None if optional => Ok(None),
                None => {
                    let what = match kind {
                        KeyedKind::Secret => "Secret",
                        KeyedKind::ConfigMap => "ConfigMap",
                    };
                    Err(config_error(format!(
                        "couldn't find key {key} in {what} {}/{name}",
                        self.pod.namespace(),
                    )))
                }
            },
            None if optional => Ok(None),
            None => Err(config_error(format!(
                "{} \"{name}\" not found",
                kind.noun()
            ))),
        }
    }

    /// The ServiceAccount tokens of the pod's projected volumes: kept while fresh in `cache`,
    /// asked for (TokenRequest, bound to this pod) when missing or past 80% of their lifetime.
    pub async fn volume_tokens(
        &self,
        cache: &mut TokenCache,
    ) -> Result<volumes::Tokens, volumes::VolumeError> {
        let now = chrono::Utc::now().timestamp();
        let spec = self.pod.spec.clone().unwrap_or_default();
        let sa = if spec.service_account_name.is_empty() {
            "default".to_string()
        } else {
            spec.service_account_name.clone()
        };
        let mut out = volumes::Tokens::new();
        for v in &spec.volumes {
            for (i, src) in v
                .projected
                .iter()
                .flat_map(|p| p.sources.iter())
                .enumerate()
            {
                let Some(t) = &src.service_account_token else {
                    continue;
                };
                let key = (v.name.clone(), i);
                if let Some((token, refresh)) = cache.get(&key)
                    && *refresh > now
                {
                    out.insert(key, token.clone());
                    continue;
                }
                let audiences: Vec<String> = if t.audience.is_empty() {
                    Vec::new()
                } else {
                    vec![t.audience.clone()]
                };
                let lifetime = t.expiration_seconds.unwrap_or(3600);
                let (token, expires) = self
                    .client
                    .request_token(
                        self.pod.namespace(),
                        &sa,
                        &audiences,
                        Some(lifetime),
                        Some((self.pod.name(), self.uid)),
                    )
                    .await
                    .map_err(|e| volumes::VolumeError {
                        volume: v.name.clone(),
                        message: format!("requesting a token of serviceaccount \"{sa}\": {e}"),
                    })?;
                let expires = if expires > now {
                    expires
                } else {
                    now + lifetime
                };
                let refresh = now + (expires - now) * 8 / 10;
                cache.insert(key.clone(), (token.clone(), refresh));
                out.insert(key, token);
            }
        }
        Ok(out)
    }

    /// The volumes bound to the claims the pod's volumes name, from the API: the claim must be
    /// Bound, its PersistentVolume a hostPath or local volume (the node agent's local-path
    /// provisioner makes hostPath ones).
    pub async fn volume_claims(&self) -> volumes::Claims {
        let mut out = volumes::Claims::new();
        for name in self.pod.claim_names() {
            let got = self.claim(&name).await;
            out.insert(name, got);
        }
        out
    }

    /// The node directory of claim `name`'s volume, or why it cannot be used yet.
    async fn claim(&self, name: &str) -> Result<volumes::ClaimVolume, String> {
        let claims = self
            .client
            .namespaced::<PersistentVolumeClaim>(self.pod.namespace());
        let c = match claims.get_opt(name).await {
            Err(e) => return Err(format!("reading persistentvolumeclaim {name:?}: {e}")),
            Ok(None) => return Err(format!("persistentvolumeclaim {name:?} not found")),
            Ok(Some(c)) => c,
        };
        let volume = c
            .spec
            .as_ref()
            .map(|s| s.volume_name.clone())
            .unwrap_or_default();
        let bound = c.status.as_ref().is_some_and(|s| s.phase == "Bound");
        if volume.is_empty() || !bound {
            return Err(format!("persistentvolumeclaim {name:?} is not bound yet"));
        }
        let pv = match self
            .client
            .cluster::<PersistentVolume>()
            .get_opt(&volume)
            .await
        {
            Err(e) => return Err(format!("reading persistentvolume {volume:?}: {e}")),
            Ok(None) => {
                return Err(format!(
                    "persistentvolume {volume:?} of claim {name:?} not found"
                ));
            }
            Ok(Some(pv)) => pv,
        };
        let spec = pv.spec.unwrap_or_default();
        if let Some(h) = spec.host_path {
            Ok(volumes::ClaimVolume {
                path: h.path,
                ty: h.r#type.unwrap_or_else(|| "DirectoryOrCreate".into()),
            })
        } else if let Some(l) = spec.local {
            Ok(volumes::ClaimVolume {
                path: l.path,
                ty: "Directory".into(),
            })
        } else {
            Err(format!(
                "persistentvolume {volume:?} is neither hostPath nor local: this node cannot \
                 attach it"
            ))
        }
    }

    /// The Secrets and ConfigMaps the pod's volumes name, from the API (`None`: not found).
    pub async fn volume_secrets(&self) -> Result<volumes::Secrets, volumes::VolumeError> {
        let mut out = volumes::Secrets::new();
        for (kind, name) in volumes::secret_names(self.pod) {
            let got = self
                .keyed(kind, &name)
                .await
                .map_err(|message| volumes::VolumeError {
                    volume: name.clone(),
                    message,
                })?;
            out.insert((kind, name), got);
        }
        Ok(out)
    }

    /// The registry credentials of the pod's `imagePullSecrets` (dockerconfigjson or
    /// dockercfg Secrets of its namespace), and the names of those that cannot be used
    /// (left out, as the kubelet does; why is logged, never their contents).
    pub async fn pull_secrets(&self) -> (RegistryAuths, Vec<String>) {
        let names: Vec<String> = self
            .pod
            .spec
            .iter()
            .flat_map(|s| s.image_pull_secrets.iter().map(|r| r.name.clone()))
            .collect();
        let mut auths = RegistryAuths::default();
        let mut missing = Vec::new();
        for name in names {
            let parsed = match self.secret(&name).await {
                Ok(None) => Err("not found".to_string()),
                Ok(Some(secret)) => registry_auths(&secret),
                Err(e) => Err(e),
            };
            match parsed {
                Ok(a) => auths = auths.or(&a),
                Err(why) => {
                    tracing::warn!(pod = %format!("{}/{}", self.pod.namespace(), self.pod.name()), secret = %name, reason = %why, "image pull secret unusable");
                    missing.push(name);
                }
            }
        }
        (auths, missing)
    }
}

/// The registry credentials of a dockerconfigjson or dockercfg Secret.
fn registry_auths(secret: &Secret) -> Result<RegistryAuths, String> {
    let (key, wrap) = match secret.r#type.as_str() {
        "kubernetes.io/dockercfg" => (".dockercfg", true),
        _ => (".dockerconfigjson", false),
    };
    match secret.data.get(key) {
        Some(bytes) if wrap => {
            let inner: Result<serde_json::Value, _> = serde_json::from_slice(bytes);
            match inner {
                Ok(v) => {
                    RegistryAuths::parse(serde_json::json!({"auths": v}).to_string().as_bytes())
                }
                Err(_) => Err("not JSON".to_string()),
            }
        }
        Some(bytes) => RegistryAuths::parse(bytes),
        None => Err(format!("it has no {key} key")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_names_replace_earlier_ones_in_place() {
        let mut env = vec![("A".to_string(), "1".to_string())];
        set(&mut env, "B".into(), "2".into());
        set(&mut env, "A".into(), "3".into());
        assert_eq!(
            env,
            [("A".to_string(), "3".to_string()), ("B".into(), "2".into())]
        );
    }

    #[test]
    fn errors_carry_their_kubernetes_reason() {
        let e = InputError::CreateContainerConfigError("secret \"s\" not found".into());
        assert_eq!(e.reason(), "CreateContainerConfigError");
        assert_eq!(e.to_string(), "secret \"s\" not found");
        let e: InputError = volumes::VolumeError {
            volume: "v".into(),
            message: "m".into(),
        }
        .into();
        assert_eq!(e.reason(), "FailedMount");
    }

    #[test]
    fn dockercfg_secrets_are_wrapped_and_missing_keys_named() {
        let mut s = Secret {
            r#type: "kubernetes.io/dockercfg".into(),
            ..Default::default()
        };
        assert_eq!(
            registry_auths(&s).err().as_deref(),
            Some("it has no .dockercfg key")
        );
        s.data.insert(".dockercfg".into(), b"{not json".to_vec());
        assert_eq!(registry_auths(&s).err().as_deref(), Some("not JSON"));
    }
}
