//! The `publish` subcommand, for the `sigma-supervise` binary to embed:
//!
//! ```text
//! sigma-supervise publish --bucket s3://B -r requirements.txt
//! sigma-supervise publish --bucket s3://B wheels/ pkgdir/ x.whl
//! ```

use std::path::PathBuf;

use crate::config::FetchConfig;
use crate::error::{FetchError, Result};
use crate::publish::{publish_with, PublishOptions, PublishReport, PublishSource, TraceRunner};
use crate::store::{open_store, StoreOptions};

/// Arguments of `publish` (a `clap::Args`, so a binary can make it a subcommand).
#[derive(Debug, Clone, clap::Args)]
pub struct PublishArgs {
    /// Bucket URL: s3://BUCKET[/PREFIX] (standard AWS configuration) or file:///DIR.
    #[arg(long, env = "SIGMA_LIB_BUCKET")]
    pub bucket: String,
    /// A requirements file: resolve with `pip download --only-binary=:all:` and publish the wheels.
    #[arg(short = 'r', long = "requirement")]
    pub requirements: Vec<PathBuf>,
    /// Python interpreter of the procs: its pip (and platform tags) resolve -r, and it
    /// byte-compiles every module so the bucket ships its `.pyc` files [default: python3; if
    /// that is missing, sources only, said in the report].
    #[arg(long)]
    pub python: Option<PathBuf>,
    /// Ship sources only (the procs' interpreter then compiles each cold import in memory).
    #[arg(long)]
    pub no_compile: bool,
    /// Archive files in path order: no import trace (by default `sigma-supervise publish`
    /// imports each package in its jail and puts the files the import reads first).
    #[arg(long)]
    pub no_trace: bool,
    /// Write the old archive layout (one tar in zstd frames) that builds before the frame
    /// index read; by default each file is a zstd frame of its own behind an index.
    #[arg(long)]
    pub tar_layout: bool,
    /// Wheels (files or directories of them), package directories and modules (NAME.py).
    pub paths: Vec<PathBuf>,
}

impl PublishArgs {
    /// The sources named on the command line.
    pub fn sources(&self) -> Result<Vec<PublishSource>> {
        let mut out: Vec<PublishSource> = self
            .requirements
            .iter()
            .map(|f| PublishSource::Requirements {
                file: f.clone(),
                python: self.python.clone(),
            })
            .collect();
        for p in &self.paths {
            out.push(PublishSource::detect(p)?);
        }
        if out.is_empty() {
            return Err(FetchError::invalid(
                "publish",
                "nothing to publish: give -r requirements.txt, wheels or package directories",
            ));
        }
        Ok(out)
    }

    /// The bytecode options the command line asks for.
    pub fn options(&self) -> PublishOptions {
        PublishOptions {
            compile_with: (!self.no_compile).then(|| {
                self.python
                    .clone()
                    .unwrap_or_else(|| PathBuf::from("python3"))
            }),
            compile_required: self.python.is_some(),
            trace: None,
            tar_layout: self.tar_layout,
        }
    }
}

/// Run `publish` as the command line asks (one report per source, in order).
pub async fn run_publish(args: &PublishArgs, cfg: &FetchConfig) -> Result<Vec<PublishReport>> {
    run_publish_traced(args, cfg, None).await
}

/// [`run_publish`], with the import trace run by `trace` (unless `--no-trace`).
pub async fn run_publish_traced(
    args: &PublishArgs,
    cfg: &FetchConfig,
    trace: Option<TraceRunner>,
) -> Result<Vec<PublishReport>> {
    let sources = args.sources()?;
    let store = open_store(&args.bucket, &StoreOptions::default(), cfg).await?;
    let opts = PublishOptions {
        trace: trace.filter(|_| !args.no_trace),
        ..args.options()
    };
    if opts.trace.is_some() && opts.compile_with.is_some() && sources.len() > 1 {
        // One publish, so each package's import trace runs with the others present.
        let all = PublishSource::Several(sources);
        return Ok(vec![publish_with(store.as_ref(), &all, cfg, &opts).await?]);
    }
    let mut reports = Vec::new();
    for s in &sources {
        reports.push(publish_with(store.as_ref(), s, cfg, &opts).await?);
    }
    Ok(reports)
}
