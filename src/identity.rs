//! Who is calling: the principal that sessions (and their files) belong to.

/// Who is calling: sessions belong to the principal that started them. Over stdio there is
/// one principal; over HTTP each token is one.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Caller {
    pub principal: String,
}

impl Caller {
    /// The single principal of a stdio connection (and of in-process callers).
    pub fn local() -> Self {
        Self {
            principal: "local".into(),
        }
    }

    /// Whether this is the local principal (stdio, or HTTP without tokens): the user who
    /// started the server, who may have it copy files of this machine into a session.
    pub fn is_local(&self) -> bool {
        *self == Self::local()
    }
}
