use super::*;
use clap::Parser;

#[derive(Parser)]
struct Wrapper {
    #[command(flatten)]
    config: Config,
}

#[test]
fn to_args_round_trips() {
    // Every field set away from its default, so a flag to_args forgets shows up here.
    let config = Config {
        prompts: Some("/p/rompts".into()),
        python: Some("/v/env/bin/python".into()),
        default_timeout_ms: 1234,
        max_timeout_ms: 5678,
        output_cap: 99,
        work_dir: Some("/w/ork dir".into()),
        idle_timeout_s: 11,
        max_idle_timeout_s: 22,
        max_sessions: 3,
        max_ended_sessions: 17,
        evict_idle: true,
        max_sessions_per_principal: 4,
        max_active_per_principal: 14,
        pool: 5,
        session_pool: 3,
        preload: Some(String::new()),
        sandbox: Mode::Landlock,
        require_sandbox: Some(Level::Landlock),
        allow_network: true,
        allow_domain: vec!["pypi.org".into(), "*.pythonhosted.org".into()],
        allow_host: vec!["index.internal:8080".into()],
        caller_domains: vec!["*.githubusercontent.com".into()],
        memory_mb: 5,
        processes: 6,
        file_size_mb: 7,
        open_files: 8,
        cpu_s: 9,
        tmpfs_mb: 10,
        uid_base: 11,
        uids: 12,
        mask: vec!["/m/ask".into(), "/other".into()],
        expose: vec!["/e/xpose".into()],
        allow_cwd: vec!["/a/llow".into()],

        max_images: 5,
        max_image_bytes: 6,
        max_tracked_files: 7,
        max_resource_bytes: 8,
        max_line_bytes: 9,
        history_cells: 9,
        history_mb: 10,
        whole_output_mb: 3,
        keep_files_s: 11,
        state_dir: Some("/s/tate".into()),
        journal_max_mb: 12,
        keep_journals_s: 13,
        task_keep_s: 14,
        task_stop_grace_ms: 15,
        no_auto_restore: true,
        mcp: crate::upstream::Flags {
            servers: Some("/m/cp.json".into()),
            grants: Some("/g/rants.json".into()),
            max_calls: 3,
            max_concurrent: 2,
            call_timeout_ms: 99,
            max_result_bytes: 1234,
        },
        cluster: crate::cluster::ClusterFlags {
            cluster: vec!["http://e1:2379".into(), "http://e2:2379".into()],
            node_id: Some("n-1".into()),
        },
        packages: crate::packages::Flags {
            no_packages: true,
            package_index: Some("https://i/simple".into()),
            package_cache: Some("/p/c".into()),
            package_cache_mb: Some(64),
            installer_uid: Some(7),
            package_timeout_s: Some(9),
            uv: Some("/u/v".into()),
            npm_registry: Some("https://r/".into()),
            npm: Some("/n/npm-cli.js".into()),
            package_builds: true,
        },
    };
    let argv = std::iter::once(OsString::from("x")).chain(config.to_args());
    let parsed = Wrapper::try_parse_from(argv).expect("to_args output parses");
    assert_eq!(format!("{:?}", parsed.config), format!("{config:?}"));
    let defaults = Wrapper::try_parse_from(
        std::iter::once(OsString::from("x")).chain(Config::default().to_args()),
    )
    .expect("parses");
    assert_eq!(
        format!("{:?}", defaults.config),
        format!("{:?}", Config::default())
    );
}

#[test]
fn preload_modules() {
    let with = |p: Option<&str>| Config {
        preload: p.map(String::from),
        ..Config::default()
    };
    assert_eq!(
        with(None).preload_modules().expect("default"),
        ["pandas", "numpy", "matplotlib"]
    );
    assert!(with(Some("")).preload_modules().expect("empty").is_empty());
    assert_eq!(
        with(Some(" polars, scipy.stats ,"))
            .preload_modules()
            .expect("list"),
        ["polars", "scipy.stats"]
    );
    for bad in ["os;import x", "a..b", "1x", "a b", "pkg.", "é"] {
        assert!(with(Some(bad)).preload_modules().is_err(), "{bad}");
    }
    assert_eq!(
        with(Some("pandas, a b"))
            .preload_modules()
            .unwrap_err()
            .to_string(),
        "--preload: \"a b\" is not a module name (comma-separated dotted names, e.g. \
         pandas,numpy,matplotlib)"
    );
}

/// Every switch's variable takes 1/0, yes/no, on/off and true/false (any case), and refuses
/// anything else. clap parses a variable's value with its argument's value parser: each
/// switch's is tried here on the command line, as a flag that takes a value.
#[test]
fn switch_variables_take_one_and_zero() {
    use clap::CommandFactory;
    let cmd = Wrapper::command();
    let switches: Vec<&clap::Arg> = cmd
        .get_arguments()
        .filter(|a| a.get_env().is_some() && matches!(a.get_action(), clap::ArgAction::SetTrue))
        .collect();
    let names: Vec<String> = switches
        .iter()
        .map(|a| a.get_env().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "REPLBOX_EVICT_IDLE",
            "REPLBOX_ALLOW_NETWORK",
            "REPLBOX_NO_AUTO_RESTORE",
            "REPLBOX_NO_PACKAGES",
            "REPLBOX_PACKAGE_BUILDS"
        ]
    );
    for arg in switches {
        let id = arg.get_id().as_str();
        let taking = clap::Command::new("x").arg(arg.clone().action(clap::ArgAction::Set));
        let parse = |v: &str| {
            taking
                .clone()
                .try_get_matches_from(["x", &format!("--{}={v}", arg.get_long().unwrap())])
                .map(|m| m.get_one::<bool>(id).copied())
        };
        for (v, on) in [
            ("1", true),
            ("yes", true),
            ("on", true),
            ("true", true),
            ("TRUE", true),
            ("0", false),
            ("no", false),
            ("off", false),
            ("false", false),
        ] {
            assert_eq!(parse(v).ok().flatten(), Some(on), "{id}={v}");
        }
        assert!(parse("maybe").is_err(), "{id}=maybe");
    }
}
