//! The admin, produce and fetch calls of [`Client`], each one request.

use braid_proto::client::{
    OffsetSpec, Request, Response, StreamSummary, TopicInfo, TopicSettings, TopicSummary,
};

use crate::client::Client;
use crate::connection::{unexpected, Fetched};
use crate::error::ClientError;

/// Streams, topics, records and groups.
impl Client {
    /// Checks the node answers.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn ping(&self) -> Result<(), ClientError> {
        self.call(&Request::Ping).await.map(|_| ())
    }

    /// Creates a stream.
    ///
    /// # Errors
    /// As [`Client::call`]; `StreamExists` if it exists.
    pub async fn create_stream(&self, name: &str) -> Result<(), ClientError> {
        self.call(&Request::CreateStream { name }).await.map(|_| ())
    }

    /// Deletes a stream with its topics.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn delete_stream(&self, name: &str) -> Result<(), ClientError> {
        self.call(&Request::DeleteStream { name }).await.map(|_| ())
    }

    /// Lists streams.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn list_streams(&self) -> Result<Vec<StreamSummary>, ClientError> {
        match self.call(&Request::ListStreams).await? {
            Response::Streams(list) => Ok(list),
            other => Err(unexpected(&other)),
        }
    }

    /// Creates a topic; settings left at 0 take the node's defaults.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn create_topic(
        &self,
        stream: &str,
        topic: &str,
        settings: TopicSettings,
    ) -> Result<(), ClientError> {
        let request = Request::CreateTopic {
            stream,
            topic,
            settings,
        };
        self.call(&request).await?;
        // Its partitions' primaries, so the first produce goes straight to them.
        if self.is_cluster() {
            if let Err(err) = self.refresh().await {
                tracing::debug!(%err, "refresh after a topic's creation failed");
            }
        }
        Ok(())
    }

    /// Deletes a topic and its data.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn delete_topic(&self, stream: &str, topic: &str) -> Result<(), ClientError> {
        self.call(&Request::DeleteTopic { stream, topic })
            .await
            .map(|_| ())
    }

    /// Lists the topics of a stream.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn list_topics(&self, stream: &str) -> Result<Vec<TopicSummary>, ClientError> {
        match self.call(&Request::ListTopics { stream }).await? {
            Response::Topics(list) => Ok(list),
            other => Err(unexpected(&other)),
        }
    }

    /// A topic's settings and partitions with their offsets.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn describe_topic(
        &self,
        stream: &str,
        topic: &str,
    ) -> Result<TopicInfo, ClientError> {
        match self.call(&Request::DescribeTopic { stream, topic }).await? {
            Response::Topic(info) => Ok(info),
            other => Err(unexpected(&other)),
        }
    }

    /// Appends one encoded batch to a partition; returns (base offset, last offset).
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn produce(
        &self,
        stream: &str,
        topic: &str,
        partition: u32,
        batch: &[u8],
    ) -> Result<(u64, u64), ClientError> {
        let request = Request::Produce {
            stream,
            topic,
            partition,
            batch,
        };
        match self.call(&request).await? {
            Response::Produced {
                base_offset,
                last_offset,
            } => Ok((base_offset, last_offset)),
            other => Err(unexpected(&other)),
        }
    }

    /// Reads committed batches from `offset`, waiting up to `max_wait_ms` at the end.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn fetch(
        &self,
        stream: &str,
        topic: &str,
        partition: u32,
        offset: u64,
        max_bytes: u32,
        max_wait_ms: u32,
    ) -> Result<Fetched, ClientError> {
        let request = Request::Fetch {
            stream,
            topic,
            partition,
            offset,
            max_bytes,
            max_wait_ms,
        };
        match self.call(&request).await? {
            Response::Fetched {
                high_watermark,
                start_offset,
                batches,
            } => Ok(Fetched {
                high_watermark,
                start_offset,
                batches,
            }),
            other => Err(unexpected(&other)),
        }
    }

    /// The earliest, latest or by-timestamp offset of a partition.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn list_offset(
        &self,
        stream: &str,
        topic: &str,
        partition: u32,
        spec: OffsetSpec,
    ) -> Result<Option<u64>, ClientError> {
        let request = Request::ListOffsets {
            stream,
            topic,
            partition,
            spec,
        };
        match self.call(&request).await? {
            Response::Offset(offset) => Ok(offset),
            other => Err(unexpected(&other)),
        }
    }

    /// The consumer groups of a stream.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn list_groups(
        &self,
        stream: &str,
    ) -> Result<Vec<braid_proto::client::GroupSummary>, ClientError> {
        match self.call(&Request::ListGroups { stream }).await? {
            Response::Groups(list) => Ok(list),
            other => Err(unexpected(&other)),
        }
    }

    /// A group's members, assignment, committed offsets and high watermarks.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn describe_group(
        &self,
        stream: &str,
        group: &str,
    ) -> Result<braid_proto::client::GroupDescription, ClientError> {
        match self.call(&Request::DescribeGroup { stream, group }).await? {
            Response::Group(description) => Ok(description),
            other => Err(unexpected(&other)),
        }
    }
}

/// Users and permissions (the node permission `users` is needed for each).
impl Client {
    /// Creates `name` with `password`. The SCRAM credential is derived here, with a
    /// fresh salt and [`braid_proto::scram::ITERATIONS_DEFAULT`] iterations: the
    /// password itself is never sent.
    ///
    /// # Errors
    /// As [`Client::call`]; `UserExists` if the name is taken.
    pub async fn create_user(&self, name: &str, password: &str) -> Result<(), ClientError> {
        let credential = derive_credential(password).await?;
        self.call(&Request::CreateUser {
            name,
            salt: &credential.salt,
            iterations: credential.iterations,
            stored_key: &credential.stored_key,
            server_key: &credential.server_key,
        })
        .await
        .map(|_| ())
    }

    /// Gives user `name` a new password (derived here, as at [`Client::create_user`]);
    /// a user may change its own, others need the node's `users` permission. Every
    /// connection logged in with the old password is closed, this one included if it
    /// is that user's.
    ///
    /// # Errors
    /// As [`Client::call`]; `UserNotFound`.
    pub async fn change_password(&self, name: &str, password: &str) -> Result<(), ClientError> {
        let credential = derive_credential(password).await?;
        self.call(&Request::ChangePassword {
            name,
            salt: &credential.salt,
            iterations: credential.iterations,
            stored_key: &credential.stored_key,
            server_key: &credential.server_key,
        })
        .await
        .map(|_| ())
    }

    /// Deletes a user and its grants; its open connections lose every permission.
    ///
    /// # Errors
    /// As [`Client::call`]; `UserNotFound`.
    pub async fn delete_user(&self, name: &str) -> Result<(), ClientError> {
        self.call(&Request::DeleteUser { name }).await.map(|_| ())
    }

    /// Every user with its grants.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn list_users(&self) -> Result<Vec<braid_proto::client::UserSummary>, ClientError> {
        match self.call(&Request::ListUsers).await? {
            Response::Users(users) => Ok(users),
            other => Err(unexpected(&other)),
        }
    }

    /// Adds permissions on a resource to a user; effective on its open connections at
    /// their next request.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn grant(
        &self,
        user: &str,
        grant: braid_proto::client::Grant,
    ) -> Result<(), ClientError> {
        self.call(&Request::GrantPermissions { user, grant })
            .await
            .map(|_| ())
    }

    /// Takes permissions on a resource from a user.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn revoke(
        &self,
        user: &str,
        grant: braid_proto::client::Grant,
    ) -> Result<(), ClientError> {
        self.call(&Request::RevokePermissions { user, grant })
            .await
            .map(|_| ())
    }
}

/// A new SCRAM credential of `password` with a fresh salt (PBKDF2 off the runtime).
async fn derive_credential(
    password: &str,
) -> Result<braid_proto::scram::ScramCredential, ClientError> {
    use braid_proto::scram::{ScramCredential, ITERATIONS_DEFAULT, SALT_BYTES};
    let mut salt = [0u8; SALT_BYTES];
    getrandom::getrandom(&mut salt)
        .map_err(|e| ClientError::Invalid(format!("drawing a salt: {e}")))?;
    let password = password.to_owned();
    tokio::task::spawn_blocking(move || {
        ScramCredential::derive(&password, &salt, ITERATIONS_DEFAULT)
    })
    .await
    .map_err(|e| ClientError::Invalid(e.to_string()))
}
