//! Attack tests of the second adversarial review, through the built server: one principal
//! binding many sandbox uids, one principal's sessions filling the egress proxy, and stdio
//! replies piling up for a client that does not read. Each fails without its fix.
//!
//! A level that cannot start here is skipped with its reason, or fails under
//! REPLBOX_REQUIRE_ALL=1.

mod common;

use common::*;
use serde_json::json;

const TOKEN_A: &str = "token-of-alice-0123456789";
const TOKEN_B: &str = "token-of-bob-9876543210ab";
const ALL: &[&str] = &["bwrap", "landlock", "none"];

fn require_all() -> bool {
    std::env::var("REPLBOX_REQUIRE_ALL").is_ok_and(|v| v == "1")
}

fn we_are_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Skip (or fail in CI) what cannot run here.
fn skip(what: impl std::fmt::Display) {
    assert!(!require_all(), "{what}");
    eprintln!("SKIP: {what}");
}

/// The principals the lock files of `base..base + n` name (empty: unbound).
fn owners(base: u32, n: u32) -> Vec<String> {
    (base..base + n)
        .map(|uid| {
            std::fs::read_to_string(format!("/run/replbox/{uid}"))
                .map(|s| s.trim().to_string())
                .unwrap_or_default()
        })
        .collect()
}

// ----- One principal binds many uids -----

// An ended session keeps its uid while its files are kept, and a principal's next session
// bound a fresh uid rather than take one of its own back: a principal starting and closing
// sessions in a loop bound every uid of the pool, for good (the bindings outlive the
// server), and every other principal was refused. A principal now has at most
// --max-active-per-principal + 4 uids bound; past that its oldest ended session gives its
// uid back (its files are removed).
#[tokio::test(flavor = "multi_thread")]
async fn a_principal_looping_start_and_close_binds_a_bounded_number_of_uids() {
    if !we_are_root() {
        skip("uids are leased only when the server runs as root");
        return;
    }
    const UIDS: u32 = 8;
    // --max-active-per-principal 1, plus 4 for ended sessions' files.
    const BOUND: usize = 5;
    let tokens = format!("{TOKEN_A},{TOKEN_B}");
    for (i, level) in ALL.iter().enumerate() {
        let base = 174_000 + 10 * i as u32;
        unbind_test_uids(base, UIDS);
        let (uids, base_s) = (UIDS.to_string(), base.to_string());
        let args = [
            "--sandbox",
            level,
            "--uids",
            &uids,
            "--uid-base",
            &base_s,
            "--max-active-per-principal",
            "1",
        ];
        let s = match HttpChild::try_start(&args, &[("REPLBOX_TOKENS", &tokens)]).await {
            Ok(s) => s,
            Err(e) => {
                skip(format_args!("level {level} does not work here: {e}"));
                continue;
            }
        };
        let a = s.connect(TOKEN_A).await;
        let b = s.connect(TOKEN_B).await;
        let mut ids = Vec::new();
        for n in 0..UIDS + 2 {
            let o = http_call(&a, "session_start", json!({"language": "bash"})).await;
            assert!(!o.is_error, "{level}: A's start #{n}: {}", o.text);
            let id = o.s("session_id").to_string();
            let o = http_call(&a, "session_close", json!({"session_id": id})).await;
            assert!(!o.is_error, "{level}: {}", o.text);
            ids.push(id);
        }
        let bound: Vec<String> = owners(base, UIDS)
            .into_iter()
            .filter(|o| !o.is_empty())
            .collect();
        assert!(
            !bound.is_empty() && bound.len() <= BOUND,
            "{level}: A bound {bound:?}, more than {BOUND}"
        );
        // The oldest ended sessions gave their uids back: their files are gone, the newest
        // one's are kept.
        let o = http_call(&a, "session_list", json!({})).await;
        let kept: Vec<&str> = o.structured["ended"]
            .as_array()
            .map(|v| v.as_slice())
            .unwrap_or_default()
            .iter()
            .filter(|e| e.get("files_kept_until").is_some())
            .filter_map(|e| e["session_id"].as_str())
            .collect();
        assert!(
            kept.len() <= BOUND,
            "{level}: kept {kept:?} of {}",
            o.structured
        );
        assert!(
            kept.contains(&ids[ids.len() - 1].as_str()) && !kept.contains(&ids[0].as_str()),
            "{level}: kept {kept:?} of {ids:?}"
        );
        // B still gets a uid, and its session works.
        let o = http_call(&b, "session_start", json!({"language": "bash"})).await;
        assert!(!o.is_error, "{level}: B's session_start: {}", o.text);
        let o = http_call(
            &b,
            "session_eval",
            json!({"session_id": o.s("session_id"), "code": "echo $((6*7))"}),
        )
        .await;
        assert!(o.text.contains("42"), "{level}: {}", o.text);
        let _ = a.cancel().await;
        let _ = b.cancel().await;
        s.stop().await;
    }
}
