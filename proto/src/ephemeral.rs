//! Ephemeral containers (`kubectl debug`): an [`EphemeralContainer`] is a [`Container`]'s
//! fields and the container whose process namespace it joins. The API server validates and
//! admits it as the container it describes, and the node agent runs it as one.

use crate::api::{Container, EphemeralContainer};

impl EphemeralContainer {
    /// The container this ephemeral container describes (its `targetContainerName` aside).
    pub fn to_container(&self) -> Container {
        Container {
            name: self.name.clone(),
            image: self.image.clone(),
            command: self.command.clone(),
            args: self.args.clone(),
            env: self.env.clone(),
            working_dir: self.working_dir.clone(),
            ports: self.ports.clone(),
            resources: self.resources.clone(),
            liveness_probe: self.liveness_probe.clone(),
            readiness_probe: self.readiness_probe.clone(),
            startup_probe: self.startup_probe.clone(),
            image_pull_policy: self.image_pull_policy.clone(),
            termination_message_path: self.termination_message_path.clone(),
            termination_message_policy: self.termination_message_policy.clone(),
            volume_mounts: self.volume_mounts.clone(),
            security_context: self.security_context.clone(),
            env_from: self.env_from.clone(),
            stdin: self.stdin,
            stdin_once: self.stdin_once,
            tty: self.tty,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_is_carried_over() {
        let e: EphemeralContainer = serde_json::from_value(serde_json::json!({
            "name": "debugger", "image": "host", "command": ["sh"], "stdin": true, "tty": true,
            "targetContainerName": "app", "terminationMessagePolicy": "File",
        }))
        .unwrap();
        let c = e.to_container();
        assert_eq!((c.name.as_str(), c.image.as_str()), ("debugger", "host"));
        assert!(c.stdin && c.tty && !c.stdin_once);
        assert_eq!(c.termination_message_policy, "File");
    }
}
