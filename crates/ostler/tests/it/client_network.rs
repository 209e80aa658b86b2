//! The client over a network that fails silently (a phone changing networks: no FIN, no
//! RST, packets just stop): `ostler attach` through a TCP relay the test freezes. The
//! client's HTTP/2 keep-alive notices the dead connection, attach says so and resubscribes
//! over a new one, and what the session does next still reaches it.
#![allow(clippy::disallowed_methods)] // spawns the ostler binary (daemon and clients)
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use crate::common;

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;

use common::client::{Served as Daemon, scenario_text};

/// A TCP relay to `to`. [`Relay::freeze`] makes every connection open at that moment go
/// silent both ways (bytes are read and dropped, nothing is forwarded, nothing closed);
/// connections made afterwards are relayed as usual.
struct Relay {
    addr: String,
    accepted: Arc<AtomicU64>,
    frozen_upto: Arc<AtomicU64>,
}

impl Relay {
    fn start(to: String) -> Self {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let accepted = Arc::new(AtomicU64::new(0));
        let frozen_upto = Arc::new(AtomicU64::new(0));
        let (count, frozen) = (accepted.clone(), frozen_upto.clone());
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(c) = c else { return };
                let Ok(up) = TcpStream::connect(&to) else {
                    return;
                };
                let n = count.fetch_add(1, Ordering::SeqCst) + 1;
                for (mut from, mut into) in
                    [(c.try_clone().unwrap(), up.try_clone().unwrap()), (up, c)]
                {
                    let frozen = frozen.clone();
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 16 * 1024];
                        loop {
                            let Ok(k) = from.read(&mut buf) else { return };
                            // Frozen: not even the end of the connection goes through
                            // (the other direction's thread keeps both sockets open).
                            if n <= frozen.load(Ordering::SeqCst) {
                                if k == 0 {
                                    return;
                                }
                                continue;
                            }
                            if k == 0 {
                                let _ = into.shutdown(std::net::Shutdown::Write);
                                return;
                            }
                            if into.write_all(&buf[..k]).is_err() {
                                return;
                            }
                        }
                    });
                }
            }
        });
        Self {
            addr,
            accepted,
            frozen_upto,
        }
    }

    fn freeze(&self) {
        self.frozen_upto
            .store(self.accepted.load(Ordering::SeqCst), Ordering::SeqCst);
    }
}

#[test]
fn attach_notices_a_silently_dead_connection_and_resubscribes() {
    let d = Daemon::start(&scenario_text());
    let out = d.ok_json(&["run", "--json", "Say hello"]);
    let id = out[0]["session"]["id"]
        .as_str()
        .expect("session id")
        .to_owned();
    let relay = Relay::start(d.addr.clone());
    let mut attach = d.spawn_client(&["attach", &id, "--json", "--addr", &relay.addr]);
    // Both streams, line by line, into one channel.
    let (tx, rx) = mpsc::channel::<String>();
    let stdout = attach.stdout.take().expect("stdout");
    let stderr = attach.stderr.take().expect("stderr");
    for r in [
        Box::new(stdout) as Box<dyn std::io::Read + Send>,
        Box::new(stderr),
    ] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(r).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
    }
    let mut seen = Vec::new();
    let mut wait_for = |what: &str, pred: &dyn Fn(&str) -> bool| {
        let deadline = std::time::Instant::now() + common::guard() * 2;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    let hit = pred(&line);
                    seen.push(line);
                    if hit {
                        return;
                    }
                }
                Err(_) => {
                    let last: Vec<String> = seen
                        .iter()
                        .rev()
                        .take(12)
                        .rev()
                        .map(|l| l.chars().take(300).collect())
                        .collect();
                    panic!(
                        "attach never printed {what}; its last lines:\n{}",
                        last.join("\n")
                    )
                }
            }
        }
    };
    // Attached: the replay of the first turn's end arrives through the relay.
    wait_for("the first turn", &|l| l.contains("\"turn_completed\""));
    relay.freeze();
    wait_for("that the stream broke", &|l| {
        l.contains("event stream interrupted") || l.contains("connection lost")
    });
    // Over a new connection, the next turn reaches it.
    d.ok_json(&["send", &id, "--json", "Say hello again"]);
    wait_for("the next message", &|l| {
        l.contains("\"user_message\"") && l.contains("Say hello again")
    });
    wait_for("the next turn's end", &|l| l.contains("\"turn_completed\""));
    let _ = attach.kill();
    let _ = attach.wait();
}
