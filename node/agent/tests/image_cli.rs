//! `skiff-node image pull|ls|rm` against a real registry on loopback: an anonymous pull, a
//! private one with the password on stdin (never on the command line, never printed), the
//! listing, and forgetting a name; a bad name and a missing tag fail with the reason.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: a failed step is the test's failure"
)]

use std::io::Write as _;
use std::process::{Command, Output, Stdio};

use serde_json::json;
use skiff_testkit::registry::{Registry, gz_layer};

fn node(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_skiff-node"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running skiff-node");
    if let Some(text) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }
    drop(child.stdin.take());
    child.wait_with_output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[tokio::test]
async fn pull_list_and_forget_images() {
    let hash = bcrypt::hash("pull-secret", 4).unwrap();
    let private = Registry::start_with(Some(&format!("ci:{hash}\n")));
    let public = Registry::start();
    let layers = vec![gz_layer(&[
        ("bin/", ""),
        ("bin/hello", "#!/bin/sh\necho hi\n"),
    ])];
    let config = json!({"architecture": "amd64", "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": ["sha256:0000000000000000000000000000000000000000000000000000000000000000"]}});
    let (digest, _) = public.push("demo/hello:v1", &layers, &config, None).await;
    private
        .push(
            "team/hello:v1",
            &layers,
            &config,
            Some(("ci", "pull-secret")),
        )
        .await;
    let state = tempfile::tempdir().unwrap();
    let dir = state.path().to_str().unwrap();
    let (pub_host, priv_host) = (public.host(), private.host());

    let name = format!("{pub_host}/demo/hello:v1");
    let out = node(
        &[
            "image",
            "pull",
            "--state-dir",
            dir,
            "--plain-http",
            &pub_host,
            &name,
        ],
        None,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains(&format!("pulled {name}")), "{stdout}");
    assert!(stdout.contains(&format!("digest {digest}")), "{stdout}");

    let secret = format!("{priv_host}/team/hello:v1");
    let pull_private = |password: &str| {
        node(
            &[
                "image",
                "pull",
                "--state-dir",
                dir,
                "--plain-http",
                &priv_host,
                "--username",
                "ci",
                &secret,
            ],
            Some(&format!("{password}\n")),
        )
    };
    let denied = pull_private("not-the-password");
    assert!(!denied.status.success());
    let err = text(&denied.stderr);
    assert!(err.contains("refused the credentials"), "{err}");
    assert!(
        !err.contains("not-the-password"),
        "the password leaked: {err}"
    );
    let allowed = pull_private("pull-secret");
    assert!(allowed.status.success(), "{}", text(&allowed.stderr));

    let ls = node(&["image", "ls", "--state-dir", dir], None);
    let listing = text(&ls.stdout);
    assert!(listing.starts_with("IMAGE"), "{listing}");
    assert!(
        listing.contains(&name) && listing.contains(&secret),
        "{listing}"
    );

    let rm = node(&["image", "rm", "--state-dir", dir, &name], None);
    assert!(rm.status.success(), "{}", text(&rm.stderr));
    let again = node(&["image", "rm", "--state-dir", dir, &name], None);
    assert!(!again.status.success());
    assert!(text(&again.stderr).contains("no image named"));
    let ls = text(&node(&["image", "ls", "--state-dir", dir], None).stdout);
    assert!(!ls.contains(&name) && ls.contains(&secret), "{ls}");

    let bad = node(&["image", "pull", "--state-dir", dir, "Not A Name"], None);
    assert!(!bad.status.success());
    assert!(
        text(&bad.stderr).contains("invalid image name"),
        "{}",
        text(&bad.stderr)
    );
    let missing = node(
        &[
            "image",
            "pull",
            "--state-dir",
            dir,
            "--plain-http",
            &pub_host,
            &format!("{pub_host}/demo/hello:nope"),
        ],
        None,
    );
    assert!(!missing.status.success());
    assert!(
        text(&missing.stderr).contains("not found in the registry"),
        "{}",
        text(&missing.stderr)
    );
}
