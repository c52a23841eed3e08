//! A request's query parameters, in order (repeated ones kept: `command=a&command=b`).

/// The query parameters of a request, in order.
#[derive(Debug, Clone, Default)]
pub(crate) struct Query(Vec<(String, String)>);

impl Query {
    pub(crate) fn parse(raw: Option<&str>) -> Query {
        Query(serde_urlencoded::from_str(raw.unwrap_or("")).unwrap_or_default())
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Every value of a repeated parameter (`command=a&command=b`), in order.
    pub fn all(&self, key: &str) -> Vec<&str> {
        self.0
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    pub fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true" | "1" | ""))
    }
}
