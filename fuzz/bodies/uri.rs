//! Resource URIs (`session::files::parse_uri`, `file_uri`): what `resources/read` is given.
//!
//! Properties, besides no panic: any session id and relative path round-trip through a URI;
//! whatever parses names a path none of whose segments holds a `/` (an encoded separator
//! cannot smuggle one in), and writing it back gives the same id and path.

use replbox::fuzzing::{file_uri, parse_uri};

/// Check one input (libFuzzer's, or a corpus file's).
pub fn run(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // As a URI a client sent.
    if let Ok((id, path)) = parse_uri(text) {
        assert_eq!(
            parse_uri(&file_uri(&id, &path)),
            Ok((id.clone(), path.clone())),
            "{text:?}"
        );
        let uri = file_uri(&id, &path);
        assert!(uri.is_ascii(), "{uri:?}");
    }
    // As an id and a path the server writes into a URI.
    let (id, path) = text.split_once('\n').unwrap_or((text, "file.txt"));
    let uri = file_uri(id, path);
    assert_eq!(
        parse_uri(&uri),
        Ok((id.to_string(), path.to_string())),
        "{uri:?}"
    );
}
