//! [`ObjectKey`]: how controllers name an object (`namespace/name`).

use std::fmt;

use skiff_api::Resource;

/// The name of an object: namespace (empty for cluster-scoped kinds) and name. This is what
/// work queues hold and reconcilers receive; the object itself is read from an informer.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ObjectKey {
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        ObjectKey {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The key of a cluster-scoped object.
    pub fn cluster(name: impl Into<String>) -> Self {
        ObjectKey::new("", name)
    }

    /// The key of `obj`.
    pub fn of<T: Resource>(obj: &T) -> Self {
        ObjectKey::new(obj.namespace(), obj.name())
    }

    /// Parses `namespace/name` or `name`.
    pub fn parse(s: &str) -> Self {
        match s.split_once('/') {
            Some((ns, name)) => ObjectKey::new(ns, name),
            None => ObjectKey::cluster(s),
        }
    }
}

/// `namespace/name`, or `name` for cluster-scoped objects (the same format as
/// [`crate::reflector::object_key`]).
impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            f.write_str(&self.name)
        } else {
            write!(f, "{}/{}", self.namespace, self.name)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_and_parse_round_trip() {
        let k = ObjectKey::new("shop", "web");
        assert_eq!(k.to_string(), "shop/web");
        assert_eq!(ObjectKey::parse("shop/web"), k);
        let c = ObjectKey::cluster("node-1");
        assert_eq!(c.to_string(), "node-1");
        assert_eq!(ObjectKey::parse("node-1"), c);
    }
}
