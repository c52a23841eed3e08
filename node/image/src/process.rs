//! Kubernetes' rules for what a container of an image runs, as pure functions (the runtime
//! applies them): the argv from `command`/`args` and the image's Entrypoint/Cmd, the
//! environment, the working directory, and `imagePullPolicy` with its defaults.

use oci_spec::image::ImageConfiguration;

/// What a container's spec says, the parts that meet the image's configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerProcess<'a> {
    pub command: &'a [String],
    pub args: &'a [String],
    /// `(name, value)` in spec order.
    pub env: &'a [(String, String)],
    pub working_dir: &'a str,
}

/// The process to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Process {
    pub argv: Vec<String>,
    /// The image's variables, then the container's; a name set by both has the
    /// container's value, in the image's position.
    pub env: Vec<(String, String)>,
    pub working_dir: String,
    /// The image's `User` (`uid`, `uid:gid`, `name` or `name:group`), if any.
    pub user: Option<String>,
}

/// Kubernetes' combination of a container spec with its image configuration:
/// `command` replaces the Entrypoint (and drops the image's Cmd), `args` replaces the Cmd.
/// `None` when nothing is left to run (no command and an image without Entrypoint or Cmd).
pub fn process(image: &ImageConfiguration, c: &ContainerProcess<'_>) -> Option<Process> {
    let cfg = image.config().as_ref();
    let entrypoint: Vec<String> = cfg.and_then(|c| c.entrypoint().clone()).unwrap_or_default();
    let cmd: Vec<String> = cfg.and_then(|c| c.cmd().clone()).unwrap_or_default();
    let argv: Vec<String> = match (c.command.is_empty(), c.args.is_empty()) {
        (true, true) => entrypoint.into_iter().chain(cmd).collect(),
        (false, true) => c.command.to_vec(),
        (true, false) => entrypoint
            .into_iter()
            .chain(c.args.iter().cloned())
            .collect(),
        (false, false) => c.command.iter().chain(c.args).cloned().collect(),
    };
    if argv.is_empty() {
        return None;
    }
    let mut env: Vec<(String, String)> = cfg
        .and_then(|c| c.env().clone())
        .unwrap_or_default()
        .into_iter()
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) => (k.to_string(), v.to_string()),
            None => (kv, String::new()),
        })
        .collect();
    for (k, v) in c.env {
        match env.iter_mut().find(|(name, _)| name == k) {
            Some(slot) => slot.1 = v.clone(),
            None => env.push((k.clone(), v.clone())),
        }
    }
    let working_dir = if !c.working_dir.is_empty() {
        c.working_dir.to_string()
    } else {
        cfg.and_then(|c| c.working_dir().clone())
            .filter(|w| !w.is_empty())
            .unwrap_or_else(|| "/".to_string())
    };
    let user = cfg.and_then(|c| c.user().clone()).filter(|u| !u.is_empty());
    Some(Process {
        argv,
        env,
        working_dir,
        user,
    })
}

/// `imagePullPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullPolicy {
    Always,
    IfNotPresent,
    Never,
}

impl PullPolicy {
    /// The policy a container spec asks for, or Kubernetes' default for `image`: `Always`
    /// for `:latest` or no tag (without a digest), `IfNotPresent` otherwise.
    pub fn of(spec: &str, image: &str) -> Result<PullPolicy, String> {
        match spec {
            "Always" => Ok(PullPolicy::Always),
            "IfNotPresent" => Ok(PullPolicy::IfNotPresent),
            "Never" => Ok(PullPolicy::Never),
            "" => {
                let last = image.rsplit('/').next().unwrap_or(image);
                let digest = image.contains('@');
                let tag = last.split_once(':').map(|(_, t)| t);
                Ok(match (digest, tag) {
                    (true, _) => PullPolicy::IfNotPresent,
                    (false, None | Some("latest")) => PullPolicy::Always,
                    (false, Some(_)) => PullPolicy::IfNotPresent,
                })
            }
            other => Err(format!(
                "imagePullPolicy: Unsupported value: {other:?}: supported values: \"Always\", \
                 \"IfNotPresent\", \"Never\""
            )),
        }
    }

    /// Whether to pull, given whether the image is present; `Err` is the waiting reason
    /// `ErrImageNeverPull` with its message.
    pub fn should_pull(self, present: bool, image: &str) -> Result<bool, String> {
        match (self, present) {
            (PullPolicy::Always, _) => Ok(true),
            (PullPolicy::IfNotPresent, present) => Ok(!present),
            (PullPolicy::Never, true) => Ok(false),
            (PullPolicy::Never, false) => Err(format!(
                "Container image \"{image}\" is not present with pull policy of Never"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(entrypoint: &[&str], cmd: &[&str]) -> ImageConfiguration {
        let json = serde_json::json!({
            "architecture": "amd64", "os": "linux",
            "config": {
                "Entrypoint": entrypoint, "Cmd": cmd,
                "Env": ["PATH=/usr/bin:/bin", "MODE=image"],
                "WorkingDir": "/srv", "User": "1000:1000",
            },
            "rootfs": {"type": "layers", "diff_ids": []},
        });
        serde_json::from_value(json).unwrap()
    }

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn command_and_args_follow_kubernetes() {
        let img = image(&["/entry"], &["--default"]);
        let run = |command: &[&str], args: &[&str]| {
            let (command, args) = (s(command), s(args));
            process(
                &img,
                &ContainerProcess {
                    command: &command,
                    args: &args,
                    ..Default::default()
                },
            )
            .unwrap()
            .argv
        };
        assert_eq!(run(&[], &[]), s(&["/entry", "--default"]));
        assert_eq!(
            run(&["/bin/sh"], &[]),
            s(&["/bin/sh"]),
            "command drops the image's Cmd"
        );
        assert_eq!(run(&[], &["--other"]), s(&["/entry", "--other"]));
        assert_eq!(run(&["/bin/sh"], &["-c", "x"]), s(&["/bin/sh", "-c", "x"]));
        let empty = image(&[], &[]);
        assert!(process(&empty, &ContainerProcess::default()).is_none());
    }

    #[test]
    fn env_workdir_and_user() {
        let img = image(&["/entry"], &[]);
        let env = vec![
            ("MODE".to_string(), "pod".to_string()),
            ("EXTRA".to_string(), "1".to_string()),
        ];
        let p = process(
            &img,
            &ContainerProcess {
                env: &env,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(
            p.env,
            [("PATH", "/usr/bin:/bin"), ("MODE", "pod"), ("EXTRA", "1")]
                .map(|(k, v)| (k.to_string(), v.to_string()))
        );
        assert_eq!(p.working_dir, "/srv");
        assert_eq!(p.user.as_deref(), Some("1000:1000"));
        let p = process(
            &img,
            &ContainerProcess {
                working_dir: "/data",
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(p.working_dir, "/data");
    }

    #[test]
    fn pull_policy_defaults() {
        use PullPolicy::*;
        for (image, want) in [
            ("busybox", Always),
            ("busybox:latest", Always),
            ("localhost:5000/busybox", Always),
            ("localhost:5000/busybox:1.36", IfNotPresent),
            ("r/busybox@sha256:0123", IfNotPresent),
        ] {
            assert_eq!(PullPolicy::of("", image), Ok(want), "{image}");
        }
        assert_eq!(PullPolicy::of("Never", "x:latest"), Ok(Never));
        assert!(
            PullPolicy::of("Sometimes", "x")
                .unwrap_err()
                .contains("Unsupported value")
        );
        assert_eq!(IfNotPresent.should_pull(true, "x"), Ok(false));
        assert_eq!(Always.should_pull(true, "x"), Ok(true));
        assert_eq!(
            Never.should_pull(false, "x:1"),
            Err("Container image \"x:1\" is not present with pull policy of Never".into())
        );
    }
}
