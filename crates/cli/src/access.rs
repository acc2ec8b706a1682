//! How the CLI reaches a node (TLS, a login) and the `user` and `acl` commands.

use std::io::BufRead;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use braid_client::{Client, ConnectOptions, Credentials, TlsOptions};
use braid_proto::client::{parse_permissions, permission_names, Grant, Resource};
use clap::Subcommand;
use serde_json::json;

use crate::table;

/// Connection options shared by every client command (and `braid bench`).
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct ConnectArgs {
    /// Log in as this user (SCRAM-SHA-256). The password comes from
    /// --password-file or BRAID_PASSWORD: no flag takes it, as flags show in `ps`.
    // Its own id: subcommands have positional `user` arguments of their own.
    #[arg(
        long = "user",
        id = "login_user",
        global = true,
        env = "BRAID_USER",
        value_name = "USER"
    )]
    user: Option<String>,
    /// A file whose first line is the password.
    #[arg(long, global = true, env = "BRAID_PASSWORD_FILE", value_name = "FILE")]
    password_file: Option<PathBuf>,
    /// Connect with TLS, trusting the CA certificates (PEM) in this file.
    #[arg(long, global = true, env = "BRAID_TLS_CA", value_name = "FILE")]
    tls_ca: Option<PathBuf>,
    /// The name the node's certificate must carry [default: the host of --addr].
    #[arg(long, global = true, env = "BRAID_TLS_SERVER_NAME")]
    tls_server_name: Option<String>,
    /// A client certificate chain (PEM), for a node that asks for one.
    #[arg(
        long,
        global = true,
        env = "BRAID_TLS_CERT",
        value_name = "FILE",
        requires = "tls_key"
    )]
    tls_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(
        long,
        global = true,
        env = "BRAID_TLS_KEY",
        value_name = "FILE",
        requires = "tls_cert"
    )]
    tls_key: Option<PathBuf>,
}

fn first_line(path: &Path) -> Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the password from {}", path.display()))?;
    Ok(text.lines().next().unwrap_or_default().to_owned())
}

impl ConnectArgs {
    /// The SDK's options for these flags and variables.
    pub(crate) fn options(&self) -> Result<ConnectOptions> {
        let tls = match &self.tls_ca {
            None => {
                if self.tls_cert.is_some() || self.tls_server_name.is_some() {
                    bail!("--tls-cert and --tls-server-name need --tls-ca");
                }
                None
            }
            Some(ca) => {
                let identity = self.tls_cert.as_deref().zip(self.tls_key.as_deref());
                Some(TlsOptions::from_files(
                    ca,
                    self.tls_server_name.as_deref(),
                    identity,
                )?)
            }
        };
        let credentials = match &self.user {
            None => None,
            Some(user) => {
                let password = match (&self.password_file, std::env::var("BRAID_PASSWORD")) {
                    (Some(file), _) => first_line(file)?,
                    (None, Ok(password)) => password,
                    (None, Err(_)) => bail!(
                        "--user {user} needs a password: --password-file FILE or BRAID_PASSWORD"
                    ),
                };
                Some(Credentials {
                    user: user.clone(),
                    password,
                })
            }
        };
        Ok(ConnectOptions {
            tls,
            credentials,
            ..ConnectOptions::default()
        })
    }
}

/// Connects to the first of `addrs` that answers, as `options` say.
pub(crate) async fn connect(addrs: &[String], options: &ConnectOptions) -> Result<Client> {
    let seeds: Vec<&str> = addrs.iter().map(String::as_str).collect();
    Client::connect_cluster(&seeds, options)
        .await
        .with_context(|| format!("connecting to {}", addrs.join(",")))
}

#[derive(Subcommand, Debug)]
pub(crate) enum UserCommand {
    /// Create a user. Its password is read from --new-password-file, else as one line
    /// from standard input; only its SCRAM keys reach the node.
    Create {
        name: String,
        #[arg(long, value_name = "FILE")]
        new_password_file: Option<PathBuf>,
    },
    /// Give a user a new password (a user may change its own; others need the node's
    /// `users` permission). Read as at `create`. Every connection logged in with the
    /// old one is closed.
    Passwd {
        name: String,
        #[arg(long, value_name = "FILE")]
        new_password_file: Option<PathBuf>,
    },
    /// List users with their permissions.
    List,
    /// Delete a user and its permissions; its connections are closed.
    Delete { name: String },
}

#[derive(Subcommand, Debug)]
pub(crate) enum AclCommand {
    /// Give a user permissions: `braid acl grant alice stream:orders read,write`.
    /// Resources: `stream:NAME`, `*` (every stream), `node`. Stream permissions:
    /// read, write, manage (or all); node permissions: users, streams.
    Grant {
        user: String,
        resource: String,
        permissions: String,
    },
    /// Take permissions from a user.
    Revoke {
        user: String,
        resource: String,
        permissions: String,
    },
    /// List grants, of one user or of all.
    List { user: Option<String> },
}

fn grant_of(resource: &str, permissions: &str) -> Result<Grant> {
    let Some(resource) = Resource::parse(resource) else {
        bail!("resource {resource:?} is not stream:NAME, * or node");
    };
    let permissions = parse_permissions(permissions).map_err(|name| {
        anyhow::anyhow!("{name:?} is not a permission (read, write, manage, all, users, streams)")
    })?;
    if permissions == 0 {
        bail!("no permission given");
    }
    Ok(Grant {
        resource,
        permissions,
    })
}

pub(crate) async fn user_command(
    client: &Client,
    as_json: bool,
    command: UserCommand,
) -> Result<()> {
    match command {
        UserCommand::Create {
            name,
            new_password_file,
        } => {
            let password = new_password(&name, new_password_file.as_deref())?;
            client.create_user(&name, &password).await?;
            eprintln!("created user {name}");
        }
        UserCommand::Passwd {
            name,
            new_password_file,
        } => {
            let password = new_password(&name, new_password_file.as_deref())?;
            client.change_password(&name, &password).await?;
            eprintln!("changed the password of {name}; its other connections are closed");
        }
        UserCommand::Delete { name } => {
            client.delete_user(&name).await?;
            eprintln!("deleted user {name}");
        }
        UserCommand::List => list_grants(client, as_json, None).await?,
    }
    Ok(())
}

/// A new password for `name`: the first line of `file`, else one line of standard
/// input; never empty.
fn new_password(name: &str, file: Option<&std::path::Path>) -> Result<String> {
    let password = match file {
        Some(file) => first_line(file)?,
        None => {
            eprintln!("password for {name} (one line on standard input):");
            let mut line = String::new();
            std::io::stdin().lock().read_line(&mut line)?;
            line.trim_end_matches(['\n', '\r']).to_owned()
        }
    };
    if password.is_empty() {
        bail!("the password is empty");
    }
    Ok(password)
}

pub(crate) async fn acl_command(client: &Client, as_json: bool, command: AclCommand) -> Result<()> {
    match command {
        AclCommand::Grant {
            user,
            resource,
            permissions,
        } => {
            let grant = grant_of(&resource, &permissions)?;
            client.grant(&user, grant).await?;
            eprintln!("granted {permissions} on {resource} to {user}");
        }
        AclCommand::Revoke {
            user,
            resource,
            permissions,
        } => {
            let grant = grant_of(&resource, &permissions)?;
            client.revoke(&user, grant).await?;
            eprintln!("revoked {permissions} on {resource} from {user}");
        }
        AclCommand::List { user } => list_grants(client, as_json, user.as_deref()).await?,
    }
    Ok(())
}

async fn list_grants(client: &Client, as_json: bool, only: Option<&str>) -> Result<()> {
    let users = client.list_users().await?;
    let users: Vec<_> = users
        .into_iter()
        .filter(|u| only.is_none_or(|name| u.name == name))
        .collect();
    if let (Some(name), true) = (only, users.is_empty()) {
        bail!("no user {name}");
    }
    if as_json {
        let list: Vec<_> = users
            .iter()
            .map(|u| {
                let grants: Vec<_> = u
                    .grants
                    .iter()
                    .map(|g| json!({"resource": g.resource.to_string(), "permissions": permission_names(g.permissions)}))
                    .collect();
                json!({"user": u.name, "grants": grants})
            })
            .collect();
        println!("{}", json!(list));
        return Ok(());
    }
    let mut rows = Vec::new();
    for user in &users {
        if user.grants.is_empty() {
            rows.push(vec![user.name.clone(), "-".into(), "-".into()]);
        }
        for grant in &user.grants {
            rows.push(vec![
                user.name.clone(),
                grant.resource.to_string(),
                permission_names(grant.permissions),
            ]);
        }
    }
    table::print(&["USER", "RESOURCE", "PERMISSIONS"], rows);
    Ok(())
}
