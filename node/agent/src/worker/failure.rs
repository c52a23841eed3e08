//! Why a pod or one of its containers cannot run, by the Kubernetes reason its status shows.

use super::inputs::InputError;

/// A pod-level problem, shown in the pod's `status.reason` and `status.message`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PodFailure {
    #[error("{0}")]
    SandboxCreateFailed(String),
    #[error("{0}")]
    DeviceConfinementFailed(String),
    #[error("{0}")]
    NetworkSetupFailed(String),
    /// An input of the pod (a volume's source, a container's configuration).
    #[error(transparent)]
    Input(#[from] InputError),
}

impl PodFailure {
    pub fn reason(&self) -> &'static str {
        match self {
            PodFailure::SandboxCreateFailed(_) => "SandboxCreateFailed",
            PodFailure::DeviceConfinementFailed(_) => "DeviceConfinementFailed",
            PodFailure::NetworkSetupFailed(_) => "NetworkSetupFailed",
            PodFailure::Input(e) => e.reason(),
        }
    }
}

/// Why a registry-image container could not be made ready to start: its waiting reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum StartError {
    #[error("{0}")]
    ErrImagePull(String),
    #[error("{0}")]
    ErrImageNeverPull(String),
    #[error("{0}")]
    CreateContainerError(String),
    /// A pull the registry client failed, with the reason it gave.
    #[error("{message}")]
    Pull {
        reason: &'static str,
        message: String,
    },
    #[error(transparent)]
    Input(#[from] InputError),
}

impl StartError {
    pub fn reason(&self) -> &'static str {
        match self {
            StartError::ErrImagePull(_) => "ErrImagePull",
            StartError::ErrImageNeverPull(_) => "ErrImageNeverPull",
            StartError::CreateContainerError(_) => "CreateContainerError",
            StartError::Pull { reason, .. } => reason,
            StartError::Input(e) => e.reason(),
        }
    }

    /// Whether the image could not be pulled (retried as `ImagePullBackOff`).
    pub fn is_pull(&self) -> bool {
        matches!(self.reason(), "ErrImagePull" | "ImagePullBackOff")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_kubernetes_reasons() {
        let f = PodFailure::from(InputError::FailedMount("m".into()));
        assert_eq!((f.reason(), f.to_string().as_str()), ("FailedMount", "m"));
        assert_eq!(
            PodFailure::NetworkSetupFailed("x".into()).reason(),
            "NetworkSetupFailed"
        );
        let e = StartError::Pull {
            reason: "ErrImagePull",
            message: "unauthorized".into(),
        };
        assert!(e.is_pull());
        assert_eq!(e.to_string(), "unauthorized");
        assert!(!StartError::CreateContainerError("x".into()).is_pull());
        assert!(!StartError::from(InputError::CreateContainerConfigError("x".into())).is_pull());
    }
}
