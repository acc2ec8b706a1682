//! SCRAM-SHA-256 (RFC 5802 with RFC 7677's hash), the client authentication of the
//! native protocol, as two pure state machines: [`ScramClient`] and [`ScramServer`]
//! take messages and give messages; the caller moves them over `Authenticate`
//! requests and supplies the random nonces.
//!
//! Why SCRAM and not passwords checked against a slow hash: the password never
//! crosses the wire (not even at `CreateUser`, which carries the derived keys), the
//! node stores only keys from which no password and no login can be read, the node's
//! work per login is a few HMACs (a flood of logins cannot burn its CPU on a slow hash;
//! the client pays the PBKDF2 iterations), and the client checks the node's proof, so
//! a node that does not hold the credential cannot pretend to.
//!
//! Channel binding is not offered (`n,,`): TLS, when on, already authenticates the
//! node. User names follow the name rule of streams (`a-z A-Z 0-9 - _ .`), so no
//! SASLname escaping is ever needed; passwords are used as their UTF-8 bytes (no
//! SASLprep).

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// The mechanism name carried by `Authenticate`.
pub const MECHANISM: &str = "SCRAM-SHA-256";
/// Fewest PBKDF2 iterations a credential may have (RFC 7677's minimum).
pub const ITERATIONS_MIN: u32 = 4096;
/// Most iterations a client accepts from a node: more would let a hostile node make
/// the client spin.
pub const ITERATIONS_MAX: u32 = 10_000_000;
/// Iterations of a credential made by the SDK, the CLI and the bootstrap admin.
pub const ITERATIONS_DEFAULT: u32 = 16_384;
/// Bytes of a credential's salt made by this crate's callers.
pub const SALT_BYTES: usize = 16;
/// Most bytes of a credential's salt a node stores: the salt goes out in every login's
/// server-first message, so an unbounded one would let a stranger's 56-byte login
/// start draw an answer of any size.
pub const SALT_BYTES_MAX: usize = 64;
/// Bytes of each key.
pub const KEY_BYTES: usize = 32;
/// Longest SCRAM message accepted.
const MESSAGE_BYTES_MAX: usize = 1024;

type HmacSha256 = Hmac<Sha256>;

/// Why a SCRAM step failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScramError {
    /// A message does not follow RFC 5802's grammar.
    #[error("malformed SCRAM message: {0}")]
    Malformed(&'static str),
    /// The server's nonce does not extend the client's.
    #[error("the server's nonce does not start with the client's")]
    NonceMismatch,
    /// Iterations outside `ITERATIONS_MIN..=ITERATIONS_MAX`.
    #[error("iteration count {0} is outside {ITERATIONS_MIN}..={ITERATIONS_MAX}")]
    Iterations(u32),
    /// The client's proof is wrong (wrong password or unknown user: the same error).
    #[error("authentication failed")]
    BadProof,
    /// The server's signature is wrong: it does not hold the credential.
    #[error("the node's signature is wrong: it does not know this user's credential")]
    BadServerSignature,
    /// The server answered with `e=`.
    #[error("the node refused: {0}")]
    Refused(String),
}

/// What a node stores for a user: nothing from which the password or a login follows.
#[derive(Clone, PartialEq, Eq)]
pub struct ScramCredential {
    /// The PBKDF2 salt.
    pub salt: Vec<u8>,
    /// PBKDF2 iterations.
    pub iterations: u32,
    /// `H(HMAC(SaltedPassword, "Client Key"))`.
    pub stored_key: [u8; KEY_BYTES],
    /// `HMAC(SaltedPassword, "Server Key")`.
    pub server_key: [u8; KEY_BYTES],
}

impl std::fmt::Debug for ScramCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScramCredential")
            .field("iterations", &self.iterations)
            .finish_non_exhaustive()
    }
}

impl ScramCredential {
    /// Derives the credential of `password` (PBKDF2 with `iterations`: slow on purpose).
    pub fn derive(password: &str, salt: &[u8], iterations: u32) -> Self {
        let salted = salted_password(password, salt, iterations);
        Self::from_salted(&salted, salt, iterations)
    }

    /// The stand-in credential a node shows for an unknown `user`: its salt is derived
    /// from `secret` and the name, so it is the same on every try and looks like a real
    /// one; its keys match no password.
    pub fn stand_in(secret: &[u8], user: &str) -> Self {
        let salt = hmac(secret, format!("salt:{user}").as_bytes());
        Self {
            salt: salt[..SALT_BYTES].to_vec(),
            iterations: ITERATIONS_DEFAULT,
            stored_key: hmac(secret, format!("stored:{user}").as_bytes()),
            server_key: hmac(secret, format!("server:{user}").as_bytes()),
        }
    }

    fn from_salted(salted: &[u8; KEY_BYTES], salt: &[u8], iterations: u32) -> Self {
        let client_key = hmac(salted, b"Client Key");
        Self {
            salt: salt.to_vec(),
            iterations,
            stored_key: sha256(&client_key),
            server_key: hmac(salted, b"Server Key"),
        }
    }
}

fn salted_password(password: &str, salt: &[u8], iterations: u32) -> [u8; KEY_BYTES] {
    let mut out = [0u8; KEY_BYTES];
    pbkdf2::pbkdf2_hmac::<Sha256>(password.as_bytes(), salt, iterations, &mut out);
    out
}

fn hmac(key: &[u8], message: &[u8]) -> [u8; KEY_BYTES] {
    // HMAC takes a key of any length: `new_from_slice` cannot fail for it.
    let mut mac = match HmacSha256::new_from_slice(key) {
        Ok(mac) => mac,
        Err(_) => unreachable_hmac(),
    };
    mac.update(message);
    mac.finalize().into_bytes().into()
}

#[cold]
fn unreachable_hmac() -> ! {
    // `Hmac::new_from_slice` only fails for fixed-key MACs, which HMAC is not.
    panic!("HMAC-SHA-256 refused a key")
}

fn sha256(bytes: &[u8]) -> [u8; KEY_BYTES] {
    Sha256::digest(bytes).into()
}

fn xor(a: &[u8; KEY_BYTES], b: &[u8; KEY_BYTES]) -> [u8; KEY_BYTES] {
    let mut out = [0u8; KEY_BYTES];
    for (o, (x, y)) in out.iter_mut().zip(a.iter().zip(b)) {
        *o = x ^ y;
    }
    out
}

/// A printable nonce (base64) of random `bytes`.
pub fn nonce_from(bytes: &[u8]) -> String {
    BASE64.encode(bytes)
}

/// Compares in time independent of where the inputs differ.
fn equal_in_constant_time(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A nonce must be printable ASCII without commas (RFC 5802 `printable`).
fn check_nonce(nonce: &str) -> Result<(), ScramError> {
    if nonce.is_empty()
        || !nonce
            .bytes()
            .all(|b| (0x21..=0x7e).contains(&b) && b != b',')
    {
        return Err(ScramError::Malformed("nonce"));
    }
    Ok(())
}

/// Splits `message` into its `k=value` attributes, checking their order.
fn attributes<const N: usize>(message: &str, keys: [char; N]) -> Result<[&str; N], ScramError> {
    if message.len() > MESSAGE_BYTES_MAX {
        return Err(ScramError::Malformed("message too long"));
    }
    let mut out = [""; N];
    let mut parts = message.split(',');
    for (slot, key) in out.iter_mut().zip(keys) {
        let part = parts
            .next()
            .ok_or(ScramError::Malformed("missing attribute"))?;
        let value = part
            .strip_prefix(key)
            .and_then(|rest| rest.strip_prefix('='))
            .ok_or(ScramError::Malformed("unexpected attribute"))?;
        *slot = value;
    }
    // Extensions are not supported: a mandatory one must fail, an optional one is
    // refused too, so every accepted message has one meaning.
    if parts.next().is_some() {
        return Err(ScramError::Malformed("unexpected extension"));
    }
    Ok(out)
}

fn decode_base64(value: &str, what: &'static str) -> Result<Vec<u8>, ScramError> {
    BASE64
        .decode(value)
        .map_err(|_| ScramError::Malformed(what))
}

fn decode_key(value: &str, what: &'static str) -> Result<[u8; KEY_BYTES], ScramError> {
    decode_base64(value, what)?
        .try_into()
        .map_err(|_| ScramError::Malformed(what))
}

/// The GS2 header of a client that neither uses nor supports channel binding.
const GS2_HEADER: &str = "n,,";
/// `base64(GS2_HEADER)`, the `c=` of the final message.
const GS2_HEADER_BASE64: &str = "biws";

/// The client side of one authentication.
#[derive(Debug)]
pub struct ScramClient {
    client_first_bare: String,
    nonce: String,
}

/// The client after it sent its proof: it checks the node's.
#[derive(Debug)]
pub struct ScramClientFinal {
    expected_server_signature: [u8; KEY_BYTES],
}

impl ScramClient {
    /// Starts an authentication of `user` with a random printable `nonce`; the message
    /// to send is [`ScramClient::client_first`].
    ///
    /// # Errors
    /// [`ScramError::Malformed`] for a user name with `,` or `=` or an unprintable nonce.
    pub fn new(user: &str, nonce: &str) -> Result<Self, ScramError> {
        if user.is_empty() || user.contains([',', '=']) {
            return Err(ScramError::Malformed("user name"));
        }
        check_nonce(nonce)?;
        Ok(Self {
            client_first_bare: format!("n={user},r={nonce}"),
            nonce: nonce.to_owned(),
        })
    }

    /// The client-first message.
    pub fn client_first(&self) -> String {
        format!("{GS2_HEADER}{}", self.client_first_bare)
    }

    /// Takes the server-first message and gives the client-final one (the PBKDF2 work
    /// happens here).
    ///
    /// # Errors
    /// A [`ScramError`] if the server's message is malformed, does not extend the
    /// client's nonce or asks for iterations out of range.
    pub fn answer(
        self,
        server_first: &str,
        password: &str,
    ) -> Result<(ScramClientFinal, String), ScramError> {
        let [nonce, salt, iterations] = attributes(server_first, ['r', 's', 'i'])?;
        check_nonce(nonce)?;
        if !nonce.starts_with(&self.nonce) || nonce.len() == self.nonce.len() {
            return Err(ScramError::NonceMismatch);
        }
        let salt = decode_base64(salt, "salt")?;
        let iterations: u32 = iterations
            .parse()
            .map_err(|_| ScramError::Malformed("iteration count"))?;
        if !(ITERATIONS_MIN..=ITERATIONS_MAX).contains(&iterations) {
            return Err(ScramError::Iterations(iterations));
        }
        let salted = salted_password(password, &salt, iterations);
        let client_key = hmac(&salted, b"Client Key");
        let credential = ScramCredential::from_salted(&salted, &salt, iterations);
        let without_proof = format!("c={GS2_HEADER_BASE64},r={nonce}");
        let auth_message = format!("{},{server_first},{without_proof}", self.client_first_bare);
        let signature = hmac(&credential.stored_key, auth_message.as_bytes());
        let proof = xor(&client_key, &signature);
        let final_message = format!("{without_proof},p={}", BASE64.encode(proof));
        let expected_server_signature = hmac(&credential.server_key, auth_message.as_bytes());
        Ok((
            ScramClientFinal {
                expected_server_signature,
            },
            final_message,
        ))
    }
}

impl ScramClientFinal {
    /// Checks the server-final message: the node proved it holds the credential.
    ///
    /// # Errors
    /// [`ScramError::Refused`] for `e=`, [`ScramError::BadServerSignature`], or
    /// [`ScramError::Malformed`].
    pub fn verify(&self, server_final: &str) -> Result<(), ScramError> {
        if let Some(reason) = server_final.strip_prefix("e=") {
            return Err(ScramError::Refused(reason.to_owned()));
        }
        let [signature] = attributes(server_final, ['v'])?;
        let signature = decode_key(signature, "server signature")?;
        if equal_in_constant_time(&signature, &self.expected_server_signature) {
            Ok(())
        } else {
            Err(ScramError::BadServerSignature)
        }
    }
}

/// A parsed client-first message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientFirst {
    /// The user it names.
    pub user: String,
    nonce: String,
    bare: String,
}

impl ClientFirst {
    /// Parses a client-first message.
    ///
    /// # Errors
    /// [`ScramError::Malformed`]; channel binding (`p=` or `y,,`) and authorization
    /// identities are refused.
    pub fn parse(message: &str) -> Result<Self, ScramError> {
        let bare = message
            .strip_prefix(GS2_HEADER)
            .ok_or(ScramError::Malformed(
                "only the gs2 header \"n,,\" is supported",
            ))?;
        let [user, nonce] = attributes(bare, ['n', 'r'])?;
        // A user name follows the name rule: one that cannot exist is malformed, not
        // served a stand-in exchange as an unknown user.
        if user.contains('=') || crate::client::check_name(user, 0, "user").is_err() {
            return Err(ScramError::Malformed("user name"));
        }
        check_nonce(nonce)?;
        Ok(Self {
            user: user.to_owned(),
            nonce: nonce.to_owned(),
            bare: bare.to_owned(),
        })
    }
}

/// The server side of one authentication, after the client-first message.
#[derive(Debug)]
pub struct ScramServer {
    user: String,
    credential: ScramCredential,
    /// `false` for an unknown user: the exchange runs on a stand-in credential and
    /// fails at the proof, so a stranger cannot tell unknown users from wrong passwords.
    known: bool,
    nonce: String,
    auth_message_prefix: String,
}

impl ScramServer {
    /// Answers `first` with the server-first message. `credential` is the user's, or
    /// `None` if there is no such user, in which case `stand_in` (derived from the name
    /// and a node secret, the same on every try) is used and the proof fails.
    /// `server_nonce` is a fresh random printable string.
    ///
    /// # Errors
    /// [`ScramError::Malformed`] for a bad nonce.
    pub fn start(
        first: ClientFirst,
        credential: Option<ScramCredential>,
        stand_in: ScramCredential,
        server_nonce: &str,
    ) -> Result<(Self, String), ScramError> {
        check_nonce(server_nonce)?;
        let known = credential.is_some();
        let credential = credential.unwrap_or(stand_in);
        let nonce = format!("{}{server_nonce}", first.nonce);
        let server_first = format!(
            "r={nonce},s={},i={}",
            BASE64.encode(&credential.salt),
            credential.iterations
        );
        let auth_message_prefix = format!("{},{server_first}", first.bare);
        Ok((
            Self {
                user: first.user,
                credential,
                known,
                nonce,
                auth_message_prefix,
            },
            server_first,
        ))
    }

    /// The user this exchange is for.
    pub fn user(&self) -> &str {
        &self.user
    }

    /// The `StoredKey` of the credential this exchange checks: what a login is bound
    /// to, so that a new password (or a user deleted and made again) ends it.
    pub fn stored_key(&self) -> [u8; KEY_BYTES] {
        self.credential.stored_key
    }

    /// Checks the client-final message; on success gives the authenticated user and
    /// the server-final message.
    ///
    /// # Errors
    /// [`ScramError::BadProof`] (wrong password or unknown user), or
    /// [`ScramError::Malformed`] / [`ScramError::NonceMismatch`].
    pub fn finish(self, client_final: &str) -> Result<(String, String), ScramError> {
        let [binding, nonce, proof] = attributes(client_final, ['c', 'r', 'p'])?;
        if binding != GS2_HEADER_BASE64 {
            return Err(ScramError::Malformed("channel binding"));
        }
        if nonce != self.nonce {
            return Err(ScramError::NonceMismatch);
        }
        let proof = decode_key(proof, "proof")?;
        let without_proof_len = client_final.len() - proof_suffix_len(client_final);
        let auth_message = format!(
            "{},{}",
            self.auth_message_prefix,
            &client_final[..without_proof_len]
        );
        let signature = hmac(&self.credential.stored_key, auth_message.as_bytes());
        let client_key = xor(&proof, &signature);
        let matches = equal_in_constant_time(&sha256(&client_key), &self.credential.stored_key);
        if !(matches && self.known) {
            return Err(ScramError::BadProof);
        }
        let server_signature = hmac(&self.credential.server_key, auth_message.as_bytes());
        Ok((self.user, format!("v={}", BASE64.encode(server_signature))))
    }
}

/// Bytes of `,p=...` at the end of a client-final message (checked to exist).
fn proof_suffix_len(client_final: &str) -> usize {
    client_final
        .rfind(",p=")
        .map_or(0, |at| client_final.len() - at)
}

#[cfg(test)]
mod tests {
    use super::*;

    // RFC 7677, section 3.
    const USER: &str = "user";
    const PASSWORD: &str = "pencil";
    const CLIENT_NONCE: &str = "rOprNGfwEbeRWgbNEkqO";
    const SERVER_NONCE: &str = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
    const SALT: &str = "W22ZaJ0SNY7soEsUEjb6gQ==";
    const CLIENT_FINAL: &str = "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=";
    const SERVER_FINAL: &str = "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=";

    fn credential() -> ScramCredential {
        let salt = BASE64.decode(SALT).unwrap();
        ScramCredential::derive(PASSWORD, &salt, 4096)
    }

    fn stand_in() -> ScramCredential {
        ScramCredential::derive("not the password", b"stand-in salt", ITERATIONS_MIN)
    }

    #[test]
    fn the_rfc_7677_exchange_comes_out_byte_for_byte() {
        let client = ScramClient::new(USER, CLIENT_NONCE).unwrap();
        assert_eq!(client.client_first(), "n,,n=user,r=rOprNGfwEbeRWgbNEkqO");
        let first = ClientFirst::parse(&client.client_first()).unwrap();
        let (server, server_first) =
            ScramServer::start(first, Some(credential()), stand_in(), SERVER_NONCE).unwrap();
        assert_eq!(
            server_first,
            "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
        );
        let (client, client_final) = client.answer(&server_first, PASSWORD).unwrap();
        assert_eq!(client_final, CLIENT_FINAL);
        let (user, server_final) = server.finish(&client_final).unwrap();
        assert_eq!(user, USER);
        assert_eq!(server_final, SERVER_FINAL);
        client.verify(&server_final).unwrap();
    }

    fn exchange(user: &str, password: &str, known: bool) -> Result<String, ScramError> {
        let client = ScramClient::new(user, "clientnonce").unwrap();
        let first = ClientFirst::parse(&client.client_first())?;
        let (server, server_first) =
            ScramServer::start(first, known.then(credential), stand_in(), "servernonce")?;
        let (_, client_final) = client.answer(&server_first, password)?;
        server.finish(&client_final).map(|(user, _)| user)
    }

    #[test]
    fn a_wrong_password_and_an_unknown_user_fail_alike() {
        assert_eq!(exchange(USER, PASSWORD, true).unwrap(), USER);
        assert_eq!(exchange(USER, "pencil2", true), Err(ScramError::BadProof));
        assert_eq!(
            exchange("nobody", PASSWORD, false),
            Err(ScramError::BadProof)
        );
        // Even the stand-in's own password does not log an unknown user in.
        assert_eq!(
            exchange("nobody", "not the password", false),
            Err(ScramError::BadProof)
        );
    }

    #[test]
    fn a_server_without_the_credential_is_caught_by_the_client() {
        let client = ScramClient::new(USER, CLIENT_NONCE).unwrap();
        let impostor = ScramCredential::derive("guess", b"salt", 4096);
        let first = ClientFirst::parse(&client.client_first()).unwrap();
        let (server, server_first) =
            ScramServer::start(first, Some(impostor), stand_in(), SERVER_NONCE).unwrap();
        let (client, client_final) = client.answer(&server_first, PASSWORD).unwrap();
        assert_eq!(server.finish(&client_final), Err(ScramError::BadProof));
        assert_eq!(
            client.verify(SERVER_FINAL.replace('6', "7").as_str()),
            Err(ScramError::BadServerSignature)
        );
        assert!(matches!(
            client.verify("e=other-error"),
            Err(ScramError::Refused(_))
        ));
    }

    #[test]
    fn malformed_and_hostile_messages_are_refused_not_panicked_on() {
        for bad in [
            "",
            "n,,",
            "y,,n=user,r=abc",
            "p=tls-unique,,n=user,r=abc",
            "n,a=admin,n=user,r=abc",
            "n,,r=abc,n=user",
            "n,,n=user,r=",
            "n,,n=user,r=a,b",
            "n,,n=user,r=abc,m=ext",
            "n,,n=,r=abc",
        ] {
            assert!(ClientFirst::parse(bad).is_err(), "{bad:?} was accepted");
        }
        let long = format!("n,,n=user,r={}", "a".repeat(2000));
        assert!(ClientFirst::parse(&long).is_err());
        // A name no user can have is malformed, not an unknown user's stand-in login.
        for name in ["a".repeat(300), "bad name".into(), "a/b".into()] {
            let first = format!("n,,n={name},r=abc");
            assert_eq!(
                ClientFirst::parse(&first).err(),
                Some(ScramError::Malformed("user name")),
                "{name:?}"
            );
        }
        assert!(ClientFirst::parse(&format!("n,,n={},r=abc", "a".repeat(249))).is_ok());

        let client = || ScramClient::new(USER, CLIENT_NONCE).unwrap();
        let nonce = format!("{CLIENT_NONCE}x");
        for (bad, want) in [
            (
                format!("r=other,s={SALT},i=4096"),
                ScramError::NonceMismatch,
            ),
            (
                format!("r={CLIENT_NONCE},s={SALT},i=4096"),
                ScramError::NonceMismatch,
            ),
            (format!("r={nonce},s={SALT},i=1"), ScramError::Iterations(1)),
            (
                format!("r={nonce},s={SALT},i=4000000000"),
                ScramError::Iterations(4_000_000_000),
            ),
            (
                format!("r={nonce},s=***,i=4096"),
                ScramError::Malformed("salt"),
            ),
            (
                format!("r={nonce},s={SALT},i=x"),
                ScramError::Malformed("iteration count"),
            ),
        ] {
            assert_eq!(client().answer(&bad, PASSWORD).err(), Some(want), "{bad}");
        }

        let server = || {
            let first = ClientFirst::parse("n,,n=user,r=abc").unwrap();
            ScramServer::start(first, Some(credential()), stand_in(), "def")
                .unwrap()
                .0
        };
        for bad in [
            "",
            "c=biws,r=abcdef",
            "c=eSws,r=abcdef,p=AAAA",
            "c=biws,r=abc,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
            "c=biws,r=abcdef,p=short",
            "c=biws,r=abcdef,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
        ] {
            assert!(server().finish(bad).is_err(), "{bad:?} was accepted");
        }
    }
}
