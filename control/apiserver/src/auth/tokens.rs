//! The static token file (`--token-auth-file`), kube-apiserver's format: CSV lines
//! `token,user,uid[,"group1,group2"]`. Tokens are kept only as SHA-256 digests; errors name
//! the line, never the token.

use std::collections::HashMap;

use sha2::{Digest, Sha256};

use crate::request::UserInfo;

/// Why a token file was refused.
#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    #[error("cannot read the token file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}, line {line}: {reason}")]
    Line {
        path: String,
        line: u64,
        reason: String,
    },
}

/// Tokens by digest.
#[derive(Default)]
pub struct TokenFile {
    users: HashMap<[u8; 32], UserInfo>,
}

impl std::fmt::Debug for TokenFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenFile")
            .field("tokens", &self.users.len())
            .finish()
    }
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl TokenFile {
    /// Reads a token file.
    pub fn read(path: &std::path::Path) -> Result<TokenFile, TokenFileError> {
        let text = std::fs::read_to_string(path).map_err(|source| TokenFileError::Read {
            path: path.display().to_string(),
            source,
        })?;
        TokenFile::parse(&text, &path.display().to_string())
    }

    /// Parses a token file's text (`path` names it in errors).
    pub fn parse(text: &str, path: &str) -> Result<TokenFile, TokenFileError> {
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(false)
            .flexible(true)
            .comment(Some(b'#'))
            .trim(csv::Trim::All)
            .from_reader(text.as_bytes());
        let mut users = HashMap::new();
        for record in reader.records() {
            let line_of = |r: &csv::StringRecord| r.position().map(|p| p.line()).unwrap_or(0);
            let record = record.map_err(|e| TokenFileError::Line {
                path: path.into(),
                line: e.position().map(|p| p.line()).unwrap_or(0),
                reason: "not valid CSV".into(),
            })?;
            let line = line_of(&record);
            let err = |reason: &str| TokenFileError::Line {
                path: path.into(),
                line,
                reason: reason.into(),
            };
            if record.len() < 3 {
                return Err(err(
                    "want at least 3 columns: token, user name, uid (then groups)",
                ));
            }
            let (token, name, uid) = (&record[0], &record[1], &record[2]);
            if token.is_empty() {
                return Err(err("the token is empty"));
            }
            if name.is_empty() {
                return Err(err("the user name is empty"));
            }
            let groups = record
                .get(3)
                .map(|g| {
                    g.split(',')
                        .map(str::trim)
                        .filter(|g| !g.is_empty())
                        .map(String::from)
                        .collect()
                })
                .unwrap_or_default();
            if users
                .insert(
                    digest(token),
                    UserInfo::authenticated(name.into(), uid.into(), groups),
                )
                .is_some()
            {
                return Err(err("the token appears twice"));
            }
        }
        Ok(TokenFile { users })
    }

    /// The user a token stands for.
    pub fn lookup(&self, token: &str) -> Option<UserInfo> {
        self.users.get(&digest(token)).cloned()
    }

    pub fn len(&self) -> usize {
        self.users.len()
    }

    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kube_apiserver_token_files_parse() {
        let t = TokenFile::parse(
            "# comment\nabc,alice,1,\"a,b\"\ndef,bob,2\nghi, carol ,3,ops\n",
            "tokens.csv",
        )
        .unwrap();
        assert_eq!(t.len(), 3);
        assert_eq!(
            t.lookup("def").unwrap().groups,
            vec!["system:authenticated"]
        );
        assert_eq!(t.lookup("ghi").unwrap().name, "carol");
        assert!(t.lookup("nope").is_none());
        assert!(!format!("{t:?}").contains("abc"));
    }

    #[test]
    fn bad_lines_are_named_without_the_token() {
        for (text, want) in [
            ("tok-secret,alice\n", "line 1: want at least 3 columns"),
            ("ok,a,1\n,bob,2\n", "line 2: the token is empty"),
            ("tok-secret,,1\n", "the user name is empty"),
            (
                "tok-secret,a,1\ntok-secret,b,2\n",
                "line 2: the token appears twice",
            ),
        ] {
            let e = TokenFile::parse(text, "f.csv").unwrap_err().to_string();
            assert!(e.contains(want), "{e} should contain {want}");
            assert!(!e.contains("tok-secret"), "{e}");
        }
    }
}
