use super::*;

#[test]
fn file_env_and_defaults_layer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("braid.toml");
    std::fs::write(
        &path,
        "data_dir = \"/var/lib/braid\"\nshards = 3\ncached_tail_bytes = 67108864\nrecovery = \"truncate-at-damage\"\n[topic_defaults]\nfsync = \"never\"\n",
    )
    .unwrap();
    let mut config = NodeConfig::from_file(&path).unwrap();
    assert_eq!(config.shards, 3);
    assert_eq!(config.topic_defaults.fsync, FsyncSetting::Never);
    assert_eq!(config.client_addr, NodeConfig::default().client_addr);
    assert_eq!(config.cached_tail_bytes, 64 << 20);
    assert_eq!(config.write_behind_bytes, 8 << 20);
    assert_eq!(config.recovery, RecoverySetting::TruncateAtDamage);
    config
        .apply_env([
            ("BRAID_WRITE_BEHIND_BYTES".to_owned(), "0".to_owned()),
            ("BRAID_SHARDS".to_owned(), "2".to_owned()),
            ("BRAID_FSYNC".to_owned(), "interval".to_owned()),
            ("BRAID_RECOVERY".to_owned(), "strict".to_owned()),
            ("HOME".to_owned(), "/root".to_owned()),
        ])
        .unwrap();
    assert_eq!(config.shards, 2);
    assert_eq!(config.write_behind_bytes, 0);
    assert_eq!(config.topic_defaults.fsync, FsyncSetting::Interval);
    assert_eq!(config.recovery, RecoverySetting::Strict);
    let bad = config.apply_env([("BRAID_SHARDS".to_owned(), "two".to_owned())]);
    assert!(matches!(bad, Err(ConfigError::Env { .. })));
    std::fs::write(&path, "shardz = 3\n").unwrap();
    assert!(matches!(
        NodeConfig::from_file(&path),
        Err(ConfigError::Parse { .. })
    ));
    assert!(NodeConfig::default().resolve().unwrap().shards >= 1);
}

#[test]
fn a_cluster_table_reads_from_toml_and_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("braid.toml");
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "a secret of at least sixteen bytes\n").unwrap();
    let members: String = (0..3)
        .map(|i| {
            format!(
                "[[cluster.members]]\nid = {i}\nreplica_addr = \"127.0.0.1:{}\"\nclient_addr = \"127.0.0.1:{}\"\n",
                7090 + i,
                7070 + i
            )
        })
        .collect();
    std::fs::write(
        &path,
        format!(
            "[cluster]\nid = \"prod\"\nnode_id = 2\nsecret_file = {:?}\n{members}",
            secret.display().to_string()
        ),
    )
    .unwrap();
    let config = NodeConfig::from_file(&path).unwrap();
    let cluster = config.cluster.clone().unwrap();
    assert_eq!((cluster.members.len(), cluster.node_id), (3, 2));
    assert_eq!(cluster.links_per_peer, 1, "the default k");
    assert_eq!(cluster.read_secret().unwrap().unwrap().len(), 34);
    config.clone().resolve().unwrap();
    let mut moved = config;
    moved
        .apply_env([("BRAID_NODE_ID".to_owned(), "7".to_owned())])
        .unwrap();
    assert!(moved.resolve().is_err(), "node 7 is not a member");
    let mut from_env = NodeConfig::default();
    from_env
        .apply_env([
            ("BRAID_CLUSTER_ID".to_owned(), "one".to_owned()),
            (
                "BRAID_CLUSTER_MEMBERS".to_owned(),
                "0=127.0.0.1:7090/127.0.0.1:7070".to_owned(),
            ),
        ])
        .unwrap();
    assert_eq!(from_env.cluster.as_ref().unwrap().members.len(), 1);
    from_env.resolve().unwrap();
    assert!(
        NodeConfig::default().cluster.is_none(),
        "no table: a cluster of one"
    );
}

#[test]
fn a_node_beyond_loopback_needs_authentication_or_an_explicit_opt_out() {
    let open = |authentication, allow_unauthenticated, ip: [u8; 4]| {
        NodeConfig {
            client_addr: SocketAddr::from((ip, 7070)),
            authentication,
            allow_unauthenticated,
            ..NodeConfig::default()
        }
        .resolve()
        .is_ok()
    };
    assert!(open(false, false, [127, 0, 0, 1]));
    assert!(!open(false, false, [0, 0, 0, 0]));
    assert!(!open(false, false, [10, 1, 2, 3]));
    assert!(open(true, false, [0, 0, 0, 0]));
    assert!(open(false, true, [0, 0, 0, 0]));
    let mut config = NodeConfig::default();
    config
        .apply_env([
            ("BRAID_AUTHENTICATION".to_owned(), "true".to_owned()),
            ("BRAID_ADMIN_PASSWORD".to_owned(), "hunter2".to_owned()),
            (
                "BRAID_TLS_CERT_FILE".to_owned(),
                "/etc/braid/cert.pem".to_owned(),
            ),
        ])
        .unwrap();
    assert!(config.authentication);
    assert!(
        !format!("{config:?}").contains("hunter2"),
        "a secret in debug output"
    );
    assert!(
        config.clone().resolve().is_err(),
        "a certificate without a key"
    );
    config.tls.key_file = Some("/etc/braid/key.pem".into());
    assert!(config.resolve().is_ok());
}

#[test]
fn topic_defaults_out_of_range_are_refused_naming_the_setting_and_its_range() {
    let refusal = |config: NodeConfig| match config.resolve() {
        Err(ConfigError::Invalid(message)) => message,
        other => panic!("resolved as {other:?}"),
    };
    let from_env = |name: &str, value: &str| {
        let mut config = NodeConfig::default();
        config
            .apply_env([(format!("BRAID_{name}"), value.to_owned())])
            .unwrap();
        config
    };
    // A sync interval of 2^64 - 1 ms (and any beyond an hour, or 0) is refused.
    let message = refusal(from_env("FSYNC_INTERVAL_MS", &u64::MAX.to_string()));
    assert!(
        message.contains("topic_defaults.fsync_interval_ms = 18446744073709551615")
            && message.contains("1 to 3600000"),
        "{message}"
    );
    for bad in [0, FSYNC_INTERVAL_MS_MAX + 1] {
        let mut config = NodeConfig::default();
        config.topic_defaults.fsync_interval_ms = bad;
        refusal(config);
    }
    from_env("FSYNC_INTERVAL_MS", "3600000").resolve().unwrap();

    // Retention: "forever" is the explicit form; 2^64 - 1 is the same value, and
    // 0 (the older spelling) still means it. 2^63, which once wrapped negative and
    // deleted every sealed segment, is refused, as is anything beyond 100 years.
    for name in ["RETENTION_MS", "RETENTION_BYTES"] {
        for forever in ["forever", "18446744073709551615", "0"] {
            let config = from_env(name, forever).resolve().unwrap();
            let value = if name == "RETENTION_MS" {
                config.topic_defaults.retention_ms
            } else {
                config.topic_defaults.retention_bytes
            };
            assert!(value == RETENTION_FOREVER || value == 0, "{name}={forever}");
        }
        let message = refusal(from_env(name, "9223372036854775808"));
        assert!(
            message.contains(&name.to_lowercase()) && message.contains("\"forever\""),
            "{message}"
        );
        let mut config = NodeConfig::default();
        assert!(matches!(
            config.apply_env([(format!("BRAID_{name}"), "never".to_owned())]),
            Err(ConfigError::Env { .. })
        ));
    }
    let mut config = NodeConfig::default();
    config.topic_defaults.retention_ms = RETENTION_MS_MAX + 1;
    refusal(config);
    let mut config = NodeConfig::default();
    config.topic_defaults.retention_ms = RETENTION_MS_MAX;
    config.topic_defaults.retention_bytes = RETENTION_BYTES_MAX;
    config.resolve().unwrap();

    // The same from a file: "forever" (or its value), or a number in range.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("braid.toml");
    let file = |text: &str| {
        std::fs::write(&path, format!("[topic_defaults]\n{text}\n")).unwrap();
        NodeConfig::from_file(&path)
    };
    let config = file("retention_ms = \"forever\"\nretention_bytes = \"forever\"").unwrap();
    assert_eq!(
        (
            config.topic_defaults.retention_ms,
            config.topic_defaults.retention_bytes
        ),
        (RETENTION_FOREVER, RETENTION_FOREVER)
    );
    config.resolve().unwrap();
    assert_eq!(
        file("retention_ms = 86400000")
            .unwrap()
            .topic_defaults
            .retention_ms,
        86_400_000
    );
    assert_eq!(
        file("retention_ms = 18446744073709551615")
            .unwrap()
            .topic_defaults
            .retention_ms,
        RETENTION_FOREVER
    );
    for bad in [
        "retention_ms = -1",
        "retention_ms = \"never\"",
        "retention_ms = 1.5",
    ] {
        assert!(matches!(file(bad), Err(ConfigError::Parse { .. })), "{bad}");
    }
    for bad in [
        "retention_ms = 9223372036854775807",
        "retention_bytes = 9223372036854775807",
        "fsync_interval_ms = 9223372036854775807",
        "max_batch_bytes = 1",
        "max_batch_bytes = 8192\nsegment_bytes = 4096",
    ] {
        let message = refusal(file(bad).unwrap());
        let setting = bad.split(' ').next().unwrap();
        assert!(
            message.contains(&format!("topic_defaults.{setting}")),
            "{bad}: {message}"
        );
    }

    // The node's timeouts stop at a day: a deadline of 2^64 - 1 ms would panic.
    for name in [
        "CONNECTION_IDLE_MS",
        "CONNECTION_LOGIN_MS",
        "CONNECTION_FRAME_MS",
        "CONNECTION_FIRST_FRAME_MS",
        "CONNECTION_WRITE_TIMEOUT_MS",
        "SHUTDOWN_GRACE_MS",
        "RETENTION_CHECK_MS",
    ] {
        let message = refusal(from_env(name, &u64::MAX.to_string()));
        assert!(message.contains(&name.to_lowercase()), "{message}");
        from_env(name, &TIMEOUT_MS_MAX.to_string())
            .resolve()
            .unwrap();
    }
}
