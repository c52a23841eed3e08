//! A client that trickles its request headers (slowloris), or sends no request at all (not
//! even a whole HTTP/2 preface), is cut off after the header timeout, while other clients
//! keep being answered.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: a failed step is the test's failure"
)]

mod common;

use std::time::{Duration, Instant};

use common::{Backend, TestServer};
use skiff_apiserver::ApiServerOptions;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_header_clients_are_cut_off_and_others_answered() {
    let server = TestServer::start_with(
        Backend::Embedded,
        ApiServerOptions {
            header_read_timeout: Duration::from_secs(1),
            ..ApiServerOptions::default()
        },
    )
    .await;
    let addr = server
        .handle
        .endpoint()
        .trim_start_matches("http://")
        .to_string();
    // Fifty connections that each send half a request line and then one byte a while.
    let mut slow = Vec::new();
    for _ in 0..50 {
        let mut s = TcpStream::connect(&addr).await.unwrap();
        s.write_all(b"GET /version HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            .await
            .unwrap();
        slow.push(s);
    }
    // And some that send nothing at all, or half of HTTP/2's preface: they never become a
    // request, so only a deadline on the first request closes them.
    let mut silent = Vec::new();
    for greeting in [&b""[..], &b"PRI * HTTP/2.0\r\n"[..]] {
        for _ in 0..10 {
            let mut s = TcpStream::connect(&addr).await.unwrap();
            s.write_all(greeting).await.unwrap();
            silent.push(s);
        }
    }
    let started = Instant::now();
    // Others are answered meanwhile.
    for _ in 0..5 {
        let mut s = TcpStream::connect(&addr).await.unwrap();
        s.write_all(b"GET /version HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut answer))
            .await
            .expect("answered while slow clients wait")
            .unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
    // Each slow one trickles a byte every 300 ms: the server closes it after ~1 s of
    // headers, not when the client stops.
    for s in &mut slow {
        let _ = s.write_all(b"a").await;
    }
    for s in &mut slow {
        let mut buf = [0u8; 256];
        loop {
            let _ = s.write_all(b"a").await;
            match tokio::time::timeout(Duration::from_millis(300), s.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => break,
                Ok(Ok(_)) => break, // an error answer, then the close
                Err(_) => {
                    assert!(
                        started.elapsed() < Duration::from_secs(10),
                        "a slow client is still connected after 10 s"
                    );
                }
            }
        }
    }
    // The silent ones, which send nothing more, are closed too.
    for s in &mut silent {
        let mut buf = [0u8; 256];
        let closed = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf)).await;
        assert!(
            matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
            "a client that sent no request is still connected after 10 s"
        );
    }
    assert!(started.elapsed() < Duration::from_secs(12));
}
