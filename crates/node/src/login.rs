//! One connection's authentication: a pure state machine over the `Authenticate`
//! messages (SCRAM-SHA-256, see `braid_proto::scram`). The connection supplies the
//! user table, the node's stand-in secret and a fresh nonce.

use braid_proto::scram::{
    ClientFirst, ScramCredential, ScramError, ScramServer, KEY_BYTES, MECHANISM,
};

use crate::access::Access;

/// Where a connection's login stands.
#[derive(Debug, Default)]
pub(crate) enum Login {
    /// Nothing sent yet.
    #[default]
    Anonymous,
    /// The server-first message went out; the client's proof is awaited.
    Exchanging(Box<ScramServer>),
    /// Logged in as `user` with the credential whose `StoredKey` is `key`: the login
    /// lasts while that user has that credential, so a new password, or the user
    /// deleted (and perhaps made again under the same name), ends it.
    Authenticated { user: String, key: [u8; KEY_BYTES] },
}

/// Why a login failed; the connection answers `AuthenticationFailed` and closes.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LoginError {
    #[error("unsupported mechanism {0:?}: only SCRAM-SHA-256")]
    Mechanism(String),
    #[error("this connection is already authenticated")]
    Again,
    #[error("the SCRAM message is not UTF-8")]
    NotUtf8,
    #[error("the user's password changed, or the user was deleted, during the login")]
    Lapsed,
    #[error(transparent)]
    Scram(#[from] ScramError),
}

impl Login {
    /// The logged-in user.
    pub(crate) fn user(&self) -> Option<&str> {
        match self {
            Self::Authenticated { user, .. } => Some(user),
            _ => None,
        }
    }

    /// The user a login step with `message` is for, if it names one: for the log
    /// line of a failed login.
    pub(crate) fn attempted(&self, message: &[u8]) -> Option<String> {
        match self {
            Self::Exchanging(server) => Some(server.user().to_owned()),
            Self::Anonymous => std::str::from_utf8(message)
                .ok()
                .and_then(|m| ClientFirst::parse(m).ok())
                .map(|first| first.user),
            Self::Authenticated { user, .. } => Some(user.clone()),
        }
    }

    /// The logged-in user with the `StoredKey` of its credential.
    pub(crate) fn authenticated(&self) -> Option<(&str, &[u8; KEY_BYTES])> {
        match self {
            Self::Authenticated { user, key } => Some((user, key)),
            _ => None,
        }
    }

    /// The logged-in user if its login has lapsed: the user was deleted or its
    /// credential replaced since.
    pub(crate) fn lapsed(&self, access: &Access) -> Option<&str> {
        match self {
            Self::Authenticated { user, key } if !access.holds(user, key) => Some(user),
            _ => None,
        }
    }

    /// Takes one `Authenticate` message and gives the answer to send back.
    pub(crate) fn step(
        &mut self,
        mechanism: &str,
        message: &[u8],
        access: &Access,
        stand_in_secret: &[u8],
        nonce: &str,
    ) -> Result<Vec<u8>, LoginError> {
        if mechanism != MECHANISM {
            return Err(LoginError::Mechanism(mechanism.to_owned()));
        }
        let message = std::str::from_utf8(message).map_err(|_| LoginError::NotUtf8)?;
        match std::mem::take(self) {
            Self::Anonymous => {
                let first = ClientFirst::parse(message)?;
                let credential = access.credential(&first.user);
                let stand_in = ScramCredential::stand_in(stand_in_secret, &first.user);
                let (server, server_first) =
                    ScramServer::start(first, credential, stand_in, nonce)?;
                *self = Self::Exchanging(Box::new(server));
                Ok(server_first.into_bytes())
            }
            Self::Exchanging(server) => {
                let key = server.stored_key();
                let (user, server_final) = server.finish(message)?;
                // The credential the exchange began with may be gone by its end (the
                // password changed, the user deleted): such a login is refused, not
                // told it succeeded and ended at the next request.
                if !access.holds(&user, &key) {
                    return Err(LoginError::Lapsed);
                }
                *self = Self::Authenticated { user, key };
                Ok(server_final.into_bytes())
            }
            done @ Self::Authenticated { .. } => {
                *self = done;
                Err(LoginError::Again)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::{op, MetaOp, Metadata};
    use braid_proto::scram::ScramClient;

    fn access() -> Access {
        let mut meta = Metadata::default();
        meta.apply(&MetaOp::CreateUser(op::CreateUser {
            name: "alice".into(),
            credential: ScramCredential::derive("secret", b"salt", 4096),
        }))
        .unwrap();
        Access::from_metadata(&meta)
    }

    fn login(user: &str, password: &str) -> (Login, Result<(), LoginError>) {
        let access = access();
        let mut login = Login::default();
        let client = ScramClient::new(user, "cnonce").unwrap();
        let result = (|| {
            let first = login.step(
                MECHANISM,
                client.client_first().as_bytes(),
                &access,
                b"k",
                "snonce",
            )?;
            let first = String::from_utf8(first).unwrap();
            let (client, last) = client.answer(&first, password)?;
            let reply = login.step(MECHANISM, last.as_bytes(), &access, b"k", "unused")?;
            client.verify(std::str::from_utf8(&reply).unwrap())?;
            Ok(())
        })();
        (login, result)
    }

    #[test]
    fn a_login_ends_authenticated_or_fails_typed() {
        let (ok, result) = login("alice", "secret");
        result.unwrap();
        assert_eq!(ok.user(), Some("alice"));
        let (bad, result) = login("alice", "wrong");
        assert!(matches!(
            result,
            Err(LoginError::Scram(ScramError::BadProof))
        ));
        assert_eq!(bad.user(), None);
        let (_, result) = login("mallory", "secret");
        assert!(matches!(
            result,
            Err(LoginError::Scram(ScramError::BadProof))
        ));

        let mut done = ok;
        let again = done.step(MECHANISM, b"n,,n=alice,r=x", &access(), b"k", "n");
        assert!(matches!(again, Err(LoginError::Again)));
        assert_eq!(done.user(), Some("alice"), "a second login changes nothing");
        let mut fresh = Login::default();
        let plain = fresh.step("PLAIN", b"x", &access(), b"k", "n");
        assert!(matches!(plain, Err(LoginError::Mechanism(_))));
        let binary = fresh.step(MECHANISM, &[0xff, 0xfe], &access(), b"k", "n");
        assert!(matches!(binary, Err(LoginError::NotUtf8)));
    }

    #[test]
    fn a_password_changed_during_a_login_fails_it() {
        let before = access();
        let mut meta = Metadata::default();
        meta.apply(&MetaOp::CreateUser(op::CreateUser {
            name: "alice".into(),
            credential: ScramCredential::derive("new", b"salt2", 4096),
        }))
        .unwrap();
        let after = Access::from_metadata(&meta);
        let mut login = Login::default();
        let client = ScramClient::new("alice", "cnonce").unwrap();
        let first = login
            .step(
                MECHANISM,
                client.client_first().as_bytes(),
                &before,
                b"k",
                "s",
            )
            .unwrap();
        let (_, last) = client
            .answer(&String::from_utf8(first).unwrap(), "secret")
            .unwrap();
        let finished = login.step(MECHANISM, last.as_bytes(), &after, b"k", "u");
        assert!(matches!(finished, Err(LoginError::Lapsed)), "{finished:?}");
        assert_eq!(login.user(), None);
    }
}
