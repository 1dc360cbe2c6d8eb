//! `server.watch_config`: a reload when the config file, or a file it includes, changes on
//! disk. inotify (the `notify` crate) watches the directories that hold them, not the files:
//! an editor that writes a new file and renames it over the old one, and Kubernetes, which
//! swaps the `..data` symlink in the directory of a mounted ConfigMap, change the directory.
//! An event about the files (or Kubernetes' `..` names) only marks the watch; once events have settled for [`SETTLE`], the files are read
//! and compared with what was last loaded, and only a change reloads (through the same path,
//! checks and logs as SIGHUP).

use notify::{RecommendedWatcher, RecursiveMode, Watcher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long after the last event the files are read: a swap or a save is several events.
pub const SETTLE: Duration = Duration::from_millis(200);

/// What the watcher's thread tells the reloader: something changed, and when last.
struct Mark {
    dirty: AtomicBool,
    /// Milliseconds since `since`.
    last: AtomicU64,
    since: Instant,
}

impl Mark {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.since.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// The names in a watched directory whose events matter: the files' own (as named and where
/// their links point), and Kubernetes' `..data` and its timestamped directories (`..`). A
/// log file or an editor's swap file beside the config marks nothing (a busy one would
/// otherwise keep the events from ever settling).
fn relevant_names(files: &[PathBuf]) -> Vec<std::ffi::OsString> {
    let mut names = Vec::new();
    for f in files {
        let resolved = std::fs::canonicalize(f).ok();
        for n in [f.file_name(), resolved.as_deref().and_then(Path::file_name)]
            .into_iter()
            .flatten()
        {
            if !names.iter().any(|x| x == n) {
                names.push(n.to_os_string());
            }
        }
    }
    names
}

/// Whether an event marks the watch: one about a relevant name, or one that says events were
/// lost (the kernel's queue overflowed: a busy file beside the config on a busy machine can
/// fill it, and the config's own event may have been among those lost; notify says so with
/// [`notify::event::Flag::Rescan`]), or an error. A false mark costs a read of the files.
fn marks(event: &notify::Result<notify::Event>, names: &[std::ffi::OsString]) -> bool {
    match event {
        Ok(e) => e.need_rescan() || relevant(e, names),
        Err(_) => true,
    }
}

fn relevant(event: &notify::Event, names: &[std::ffi::OsString]) -> bool {
    event.paths.iter().any(|p| {
        p.file_name().is_some_and(|n| {
            names.iter().any(|x| x == n) || n.as_encoded_bytes().starts_with(b"..")
        })
    })
}

/// The watch of one config's files (none while `watch_config` is off).
pub struct ConfigWatch {
    watcher: Option<RecommendedWatcher>,
    mark: Arc<Mark>,
    dirs: Vec<PathBuf>,
    /// The names whose events matter (`relevant_names`).
    names: Vec<std::ffi::OsString>,
    /// Each file, and what it held when the config was last loaded (None: unreadable).
    seen: Vec<(PathBuf, Option<Vec<u8>>)>,
    /// What the running config's files held just before a reload read them (`before_reload`).
    loading: Vec<(PathBuf, Option<Vec<u8>>)>,
}

impl Default for ConfigWatch {
    fn default() -> Self {
        ConfigWatch {
            watcher: None,
            mark: Arc::new(Mark {
                dirty: AtomicBool::new(false),
                last: AtomicU64::new(0),
                since: Instant::now(),
            }),
            dirs: Vec::new(),
            names: Vec::new(),
            seen: Vec::new(),
            loading: Vec::new(),
        }
    }
}

/// The directories to watch for `files`: each one's, as named and with symlinks resolved (a
/// file edited where its link points).
fn dirs_of(files: &[PathBuf]) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    for f in files {
        // (`-c gateway.yaml`: the working directory)
        let named = f.parent().map(|p| {
            if p.as_os_str().is_empty() {
                Path::new(".")
            } else {
                p
            }
        });
        let resolved = std::fs::canonicalize(f).ok();
        let resolved = resolved.as_deref().and_then(Path::parent);
        for d in [named, resolved].into_iter().flatten() {
            if !dirs.iter().any(|x| x == d) {
                dirs.push(d.to_path_buf());
            }
        }
    }
    dirs
}

fn contents(files: &[PathBuf]) -> Vec<(PathBuf, Option<Vec<u8>>)> {
    files
        .iter()
        .map(|f| (f.clone(), std::fs::read(f).ok()))
        .collect()
}

impl ConfigWatch {
    /// Watch `files` (the running config's file and includes) when `on`, as they are now;
    /// after every reload, whether it took or not (a broken file is not read again until it
    /// changes again).
    pub fn follow(&mut self, on: bool, files: &[PathBuf]) {
        if !on {
            self.watcher = None;
            self.dirs.clear();
            self.seen.clear();
            return;
        }
        self.seen = contents(files);
        // a file written while the reload read the files, or before this watch began (no
        // event reached it), holds something else than before the reload: compared at the
        // next tick, it reloads again (a file the reload read as it is now changes nothing)
        for (f, was) in std::mem::take(&mut self.loading) {
            if let Some(seen) = self.seen.iter_mut().find(|(g, _)| *g == f) {
                seen.1 = was;
            }
        }
        self.mark.dirty.store(true, Ordering::Release);
        let dirs = dirs_of(files);
        let names = relevant_names(files);
        if self.watcher.is_some() && dirs == self.dirs && names == self.names {
            return;
        }
        let mark = Arc::clone(&self.mark);
        let watched = names.clone();
        let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            if marks(&event, &watched) {
                mark.last.store(mark.now_ms(), Ordering::Release);
                mark.dirty.store(true, Ordering::Release);
            }
        });
        let mut watcher = match watcher {
            Ok(w) => w,
            Err(e) => {
                log::error!(
                    "watch_config: cannot watch the config's files: {e}; reload with SIGHUP"
                );
                return;
            }
        };
        for d in &dirs {
            if let Err(e) = watcher.watch(d, RecursiveMode::NonRecursive) {
                log::error!("watch_config: cannot watch {}: {e}", d.display());
            }
        }
        self.watcher = Some(watcher);
        self.dirs = dirs;
        self.names = names;
    }

    /// What the running config's files hold just before a reload reads them: what the next
    /// `follow` compares them with, so that an edit made while the reload ran is not lost.
    pub fn before_reload(&mut self, files: &[PathBuf]) {
        self.loading = contents(files);
    }

    /// What the files hold now, taken as what the running config was loaded from: at start-up,
    /// before any service runs (the watch itself starts with the reloader's task, which may run
    /// after the first requests: [`Self::follow_from_start`]).
    pub fn remember(&mut self, files: &[PathBuf]) {
        self.seen = contents(files);
    }

    /// The first watch, from the reloader's task: the files as remembered at start-up stay what
    /// they are compared with, and they are compared at the next tick, since an edit made
    /// before the watch began sent it no event.
    pub fn follow_from_start(&mut self, on: bool, files: &[PathBuf]) {
        let remembered = std::mem::take(&mut self.seen);
        self.follow(on, files);
        if on && !remembered.is_empty() {
            self.seen = remembered;
            self.mark.dirty.store(true, Ordering::Release);
        }
    }

    /// Have the files changed since they were last loaded? Asked every tick: true once events
    /// have settled and a file holds something else.
    pub fn changed(&mut self) -> Option<PathBuf> {
        let m = &self.mark;
        if self.watcher.is_none() || !m.dirty.load(Ordering::Acquire) {
            return None;
        }
        let settled = m.now_ms().saturating_sub(m.last.load(Ordering::Acquire));
        if u128::from(settled) < SETTLE.as_millis() {
            return None;
        }
        m.dirty.store(false, Ordering::Release);
        self.seen
            .iter()
            .find(|(f, was)| std::fs::read(f).ok() != *was)
            .map(|(f, _)| f.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use notify::event::{EventKind, Flag, ModifyKind};

    #[test]
    fn a_lost_event_marks_the_watch_and_a_busy_neighbour_does_not() {
        let names = vec![std::ffi::OsString::from("gateway.yaml")];
        let about = |file: &str| {
            Ok(notify::Event::new(EventKind::Modify(ModifyKind::Any))
                .add_path(PathBuf::from("/etc/tollgate").join(file)))
        };
        assert!(marks(&about("gateway.yaml"), &names));
        assert!(!marks(&about("busy.log"), &names));
        assert!(marks(&about("..data"), &names), "Kubernetes' swap");
        // the kernel's queue overflowed (what inotify gives then, through notify): the
        // config's own event may have been lost
        let overflow = Ok(notify::Event::new(EventKind::Other).set_flag(Flag::Rescan));
        assert!(marks(&overflow, &names));
        assert!(marks(&Err(notify::Error::generic("lost")), &names));
    }

    /// A file holding `a: 1` in a directory of its own (`tag`: one per test).
    fn a_file(tag: &str, name: &str) -> (PathBuf, PathBuf) {
        let dir = std::env::temp_dir().join(format!("tollgate-watch-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join(name);
        std::fs::write(&f, "a: 1\n").unwrap();
        (dir, f)
    }

    /// The first change the watch reports within 5 s.
    fn first_change(w: &mut ConfigWatch) -> Option<PathBuf> {
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            if let Some(f) = w.changed() {
                return Some(f);
            }
            std::thread::yield_now();
        }
        None
    }

    #[test]
    fn an_edit_while_a_reload_reads_the_files_reloads_again() {
        let (dir, f) = a_file("r", "limits.yaml");
        let files = [f.clone()];
        let mut w = ConfigWatch::default();
        // a reload (say a SIGHUP that turns the watch on) reads the files; the file is
        // written after that and before the watch begins: no event reaches it
        w.before_reload(&files);
        std::fs::write(&f, "a: 2\n").unwrap();
        w.follow(true, &files);
        assert_eq!(first_change(&mut w), Some(f.clone()));
        // a reload that read the files as they are changes nothing
        w.before_reload(&files);
        w.follow(true, &files);
        let until = Instant::now() + SETTLE * 2;
        while Instant::now() < until {
            assert_eq!(w.changed(), None);
            std::thread::yield_now();
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_edit_before_the_watch_began_is_compared_when_it_begins() {
        let (dir, f) = a_file("s", "gateway.yaml");
        let files = [f.clone()];
        let mut w = ConfigWatch::default();
        // loaded at start-up; edited before the reloader's task runs
        w.remember(&files);
        std::fs::write(&f, "a: 2\n").unwrap();
        w.follow_from_start(true, &files);
        assert_eq!(first_change(&mut w), Some(f.clone()));
        // off: nothing watched, nothing kept
        let mut off = ConfigWatch::default();
        off.remember(&files);
        off.follow_from_start(false, &files);
        assert_eq!(off.changed(), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
