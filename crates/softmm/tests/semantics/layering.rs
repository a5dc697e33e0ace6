//! The crate's layering, checked on its sources: which module may name which.
//!
//! softmm's modules form layers (docs/architecture.md, "Layers"; the table
//! is [`LAYERS`]): `sync`, `access` and the vocabulary (`error`, `uapi`,
//! `policy`) at the bottom, then `phys` (with the commit charge and
//! hugetlb's state), `tlb`, `pgtable`, `rmap`, then `file` and `vma`, then
//! the address space core
//! (`mm`), the features over it, `populate` and the fault handler
//! (`fault`), the system calls (`sys`) over them, and `cpu` on top.
//! Two cycles are by design: the syscalls and `populate` call the fault
//! handler, and the handler grows a stack (a change of the VMA tree, which
//! is `mm`'s). Every other upward reference is an accident this test
//! refuses, with the rule that replaces it; the exceptions left are
//! listed, each with its reason ([`UPWARD_EDGES`], now empty,
//! [`ADDRESS_SPACE_IMPLS`], [`MAPPER_DOWNCASTS`]), and a listed one that
//! is gone fails too, so the lists only shrink.
//!
//! Only code counts: comments and the unit-test module at the end of a file
//! are left out. The sources are read from `$CARGO_MANIFEST_DIR/src` at run
//! time, so the compiled test can be pointed at another checkout.

use softmm_testkit::sources::Source;

/// The modules the file `s` names as `crate::<module>`.
fn names(s: &Source) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut rest = s.code.as_str();
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        if !name.is_empty() && !out.contains(&name) {
            out.push(name);
        }
    }
    out
}

/// The library's sources, from `$CARGO_MANIFEST_DIR` at run time if set.
fn sources() -> Vec<Source> {
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string());
    softmm_testkit::sources::sources(&dir, "lib.rs")
}

#[track_caller]
fn assert_no_reference(sources: &[Source], from: impl Fn(&Source) -> bool, to: &str, rule: &str) {
    let offenders: Vec<&str> =
        sources.iter().filter(|s| from(s) && names(s).iter().any(|n| n == to)).map(|s| s.path.as_str()).collect();
    assert!(offenders.is_empty(), "{offenders:?} name crate::{to}: {rule}");
}

#[test]
fn frame_allocation_does_not_depend_on_the_fault_handler() {
    let s = sources();
    assert_no_reference(
        &s,
        |s| s.module() == "phys",
        "fault",
        "shared-write instrumentation lives in sync (sync::shared_write)",
    );
}

#[test]
fn files_do_not_depend_on_address_spaces() {
    let s = sources();
    assert_no_reference(
        &s,
        |s| s.module() == "file",
        "mm",
        "a file's reverse map holds its mappers as Weak<dyn file::Mapper>",
    );
}

#[test]
fn the_address_space_core_and_its_config_do_not_depend_on_the_fault_handler() {
    let s = sources();
    for core in ["mm/mod.rs", "mm/config.rs"] {
        assert!(s.iter().any(|f| f.path == core), "{core} is missing");
    }
    assert_no_reference(
        &s,
        |s| s.path == "mm/mod.rs" || s.path == "mm/config.rs",
        "fault",
        "FaultPolicy is vocabulary (policy.rs), carried by MmConfig in mm/config.rs",
    );
}

#[test]
fn the_address_space_core_does_not_depend_on_the_syscalls() {
    let s = sources();
    assert!(s.iter().any(|f| f.path == "sys/mod.rs"), "sys/mod.rs is missing");
    assert_no_reference(
        &s,
        |s| s.module() == "mm",
        "sys",
        "the system calls sit above the core: a shared operation moves into mm/",
    );
}

#[test]
fn syscalls_reach_the_fault_handler_through_populate() {
    let s = sources();
    // Linux's populate_vma_page_range -> __get_user_pages: the syscalls
    // fault pages in through populate, never through the handler's internals.
    let inside = |f: &Source| f.module() == "fault";
    let offenders: Vec<&str> = s
        .iter()
        .filter(|f| !inside(f) && ["handle_vma_fault", "FaultCtx", "fault::handler"].iter().any(|w| f.code.contains(w)))
        .map(|f| f.path.as_str())
        .collect();
    assert!(offenders.is_empty(), "{offenders:?} use the fault handler's internals instead of crate::populate");
    let populate = s.iter().find(|f| f.path == "populate.rs").expect("src/populate.rs");
    assert!(populate.code.contains("fn get_user_pages"), "populate.rs has no get_user_pages loop");
    for caller in ["sys/mmap.rs", "sys/mprotect.rs", "sys/mremap.rs", "sys/madvise.rs"] {
        let f = s.iter().find(|f| f.path == caller).unwrap_or_else(|| panic!("{caller} is missing"));
        assert!(names(f).iter().any(|n| n == "populate"), "{caller} does not populate through crate::populate");
    }
}

#[test]
fn the_synchronization_primitives_depend_on_nothing_above_them() {
    let s = sources();
    for f in s.iter().filter(|f| f.module() == "sync") {
        let above: Vec<String> = names(f).into_iter().filter(|n| n != "sync").collect();
        assert!(above.is_empty(), "{} names {above:?}: sync is the bottom layer", f.path);
    }
}

/// The layers, bottom first: a module may name modules of lower layers
/// only (docs/architecture.md, "Layers"). hugetlb's state that the arena,
/// the files, the VMAs and the core hold (its pool, locks, reserve maps
/// and page size) is `phys::hugetlb`; the rest of `hugetlb` (faults'
/// helpers, PMD sharing, copy-on-write, its `VmaOps`) is a feature over
/// the core. Its migration is `migrate`'s (`migrate/hugetlb.rs`, as
/// Linux's `mm/migrate.c` holds `unmap_and_move_huge_page`) and its pins
/// are `pin`'s (`pin/hugetlb.rs`).
const LAYERS: &[&[&str]] = &[
    &["error", "uapi", "policy", "sync", "access", "testing"],
    &["phys", "mmio"],
    &["tlb", "mempolicy", "watch"],
    &["pgtable", "host_file", "host_mem"],
    &["rmap"],
    &["file"],
    &["vma"],
    &["mm"],
    &["hugetlb"],
    &["migrate"],
    &["fault"],
    &["populate", "pin"],
    &["sys"],
    &["cpu", "surface"],
];

/// The edges that still point up or sideways, each with why and what
/// would remove it. The test fails on an edge not listed here, and on a
/// listed edge that is gone (remove it from the list and from
/// docs/architecture.md). There is none left: a lower module that must
/// reach up does so through a trait it defines (`vma::VmaOps`,
/// `file::Mapper`) whose hooks take only lower types.
const UPWARD_EDGES: &[(&str, &str, &str)] = &[];

/// The layer of `module`.
fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// Loom models are tests (as the unit-test modules are): they may build
/// whatever they need.
fn is_loom_model(s: &Source) -> bool {
    s.path.ends_with("loom_tests.rs") || s.path.contains("loom_tests/")
}

#[test]
fn every_edge_between_top_level_modules_points_down() {
    let s = sources();
    let mut unplaced = Vec::new();
    let mut upward: Vec<(String, String, String)> = Vec::new();
    for f in s.iter().filter(|f| f.path != "lib.rs" && !is_loom_model(f)) {
        let from = f.module().to_string();
        let Some(lf) = layer_of(&from) else {
            unplaced.push(f.path.clone());
            continue;
        };
        for to in names(f) {
            // Crate-root items (`crate::PAGE_SIZE`, re-exports) are lib.rs's.
            let Some(lt) = layer_of(&to) else { continue };
            if to != from && lt >= lf {
                upward.push((from.clone(), to, f.path.clone()));
            }
        }
    }
    assert!(unplaced.is_empty(), "{unplaced:?} belong to no layer: add their module to LAYERS");
    let unlisted: Vec<&(String, String, String)> =
        upward.iter().filter(|(a, b, _)| !UPWARD_EDGES.iter().any(|(x, y, _)| a == x && b == y)).collect();
    assert!(unlisted.is_empty(), "edges up or sideways, (from, to, file): {unlisted:?}");
    let stale: Vec<&(&str, &str, &str)> =
        UPWARD_EDGES.iter().filter(|(x, y, _)| !upward.iter().any(|(a, b, _)| a == x && b == y)).collect();
    assert!(stale.is_empty(), "{stale:?} no longer exist: take them off UPWARD_EDGES and docs/architecture.md");
}

/// The one file per feature outside `mm/` and `sys/` that may add methods
/// to the address space: the feature's entry points, the calls that every
/// layer above it makes (`mm.handle_fault(..)`, `mm.pin_user_pages(..)`),
/// as `sys/` holds the system calls. Everything else of a feature is free
/// functions over the core types, or a `VmaOps` hook; a method defined in a
/// feature folder and called from `mm/` would be an upward call the name
/// check cannot see.
const ADDRESS_SPACE_IMPLS: &[(&str, &str)] = &[
    ("fault/mod.rs", "handle_fault, handle_mm_fault and their variants: the fault handler's entry points"),
    ("pin/mod.rs", "pin_user_pages, get_user_pages and the pin queries: the public pinning calls"),
];

/// Whether `code` adds methods to `AddressSpace` (an inherent or a trait impl).
fn impls_address_space(code: &str) -> bool {
    code.lines().map(str::trim).any(|l| {
        l.starts_with("impl")
            && (l.contains(" AddressSpace {") || l.contains("::AddressSpace {") || l.contains("for AddressSpace"))
    })
}

#[test]
fn the_address_space_is_implemented_only_in_the_core_and_the_syscalls() {
    let s = sources();
    let core = |f: &Source| f.path.starts_with("mm/") || f.path.starts_with("sys/");
    let implementing: Vec<&str> =
        s.iter().filter(|f| !is_loom_model(f) && impls_address_space(&f.code)).map(|f| f.path.as_str()).collect();
    assert!(implementing.contains(&"mm/mod.rs"), "the check finds no impl AddressSpace");
    assert!(
        ADDRESS_SPACE_IMPLS.iter().all(|(p, _)| p.ends_with("/mod.rs")),
        "one file per feature: a feature's entry points are in its mod.rs"
    );
    let unlisted: Vec<&&str> = implementing
        .iter()
        .filter(|p| !core(s.iter().find(|f| f.path == **p).expect("listed")))
        .filter(|p| !ADDRESS_SPACE_IMPLS.iter().any(|(x, _)| x == *p))
        .collect();
    assert!(
        unlisted.is_empty(),
        "{unlisted:?} add methods to AddressSpace outside mm/ and sys/: a hook or a free function"
    );
    let stale: Vec<&str> = ADDRESS_SPACE_IMPLS.iter().map(|(p, _)| *p).filter(|p| !implementing.contains(p)).collect();
    assert!(stale.is_empty(), "{stale:?} no longer implement AddressSpace: take them off ADDRESS_SPACE_IMPLS");
}

/// The files that downcast a `file::Mapper` (`as_any`) to reach the
/// address space behind it, each with why: only the implementor itself,
/// in one typed function (`AddressSpace::from_mapper`), which the reverse
/// walks above the core call; a feature that needs less than the whole
/// address space gets a `Mapper` call instead.
const MAPPER_DOWNCASTS: &[(&str, &str)] = &[(
    "mm/mod.rs",
    "AddressSpace::from_mapper, for migration's reverse walks and hugetlb's (huge_pmd_share, unmap_ref_private), \
     which need the whole address space of a reverse-map entry",
)];

#[test]
fn no_mapper_is_downcast_to_an_address_space() {
    let s = sources();
    let downcasting: Vec<&str> =
        s.iter().filter(|f| !is_loom_model(f) && f.code.contains(".as_any()")).map(|f| f.path.as_str()).collect();
    let unlisted: Vec<&&str> = downcasting.iter().filter(|p| !MAPPER_DOWNCASTS.iter().any(|(x, _)| x == *p)).collect();
    assert!(unlisted.is_empty(), "{unlisted:?} downcast a file::Mapper: give the Mapper trait the call instead");
    let stale: Vec<&str> = MAPPER_DOWNCASTS.iter().map(|(p, _)| *p).filter(|p| !downcasting.contains(p)).collect();
    assert!(stale.is_empty(), "{stale:?} no longer downcast: take them off MAPPER_DOWNCASTS");
}

/// The methods that `impl AddressSpace` blocks outside `mm/` define: name
/// and file.
fn methods_outside_the_core(s: &[Source]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for f in s.iter().filter(|f| !f.path.starts_with("mm/") && !is_loom_model(f)) {
        let mut depth = 0usize;
        let mut inside = false;
        for line in f.code.lines() {
            let t = line.trim();
            if !inside && impls_address_space(t) {
                inside = true;
                depth = 0;
            }
            if inside && depth == 1 {
                let t =
                    t.trim_start_matches("pub(crate) ").trim_start_matches("pub(super) ").trim_start_matches("pub ");
                if let Some(rest) = t.strip_prefix("fn ") {
                    let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                    out.push((name, f.path.clone()));
                }
            }
            if inside {
                depth += line.matches('{').count();
                depth = depth.saturating_sub(line.matches('}').count());
                if depth == 0 && line.contains('}') {
                    inside = false;
                }
            }
        }
    }
    out
}

/// A method of the address space defined in a feature folder or in `sys/`
/// and called from `mm/` is a call upward that the names of modules do
/// not show: the core reaches a backing through its `VmaOps` hooks, a
/// file through `file::Mapper`, and shared code lives in `mm/`.
#[test]
fn the_core_calls_no_address_space_method_defined_above_it() {
    let s = sources();
    let methods = methods_outside_the_core(&s);
    assert!(methods.iter().any(|(m, _)| m == "mprotect"), "the check finds no method of sys/");
    let mut calls = Vec::new();
    for f in s.iter().filter(|f| f.path.starts_with("mm/") && !is_loom_model(f)) {
        for (m, at) in &methods {
            if [".", "Self::"].iter().any(|p| f.code.contains(&format!("{p}{m}("))) {
                calls.push(format!("{} calls {m} ({at})", f.path));
            }
        }
    }
    assert!(calls.is_empty(), "{calls:?}");
}

/// Freeing after the flush is a type (`rmap::Unmapped`): its two consumers
/// are the gather and a release with a flush's proof, `rmap::TlbFlushed`.
/// Only the address space's flushes in `mm/` make that proof, and only the
/// gather takes an unmapped reference as a bare frame number.
#[test]
fn only_the_core_flushes_release_unmapped_pages() {
    let s = sources();
    let making: Vec<&str> = s
        .iter()
        .filter(|f| !f.path.starts_with("mm/") && !is_loom_model(f) && f.code.contains("TlbFlushed::completed("))
        .map(|f| f.path.as_str())
        .collect();
    assert!(making.is_empty(), "{making:?} make a TlbFlushed: only a flush of mm/ proves one");
    assert!(
        s.iter().any(|f| f.path == "mm/mod.rs" && f.code.contains("TlbFlushed::completed(")),
        "the check finds no flush that makes the proof"
    );
    let gathering: Vec<&str> = s
        .iter()
        .filter(|f| f.path != "mm/gather.rs" && !is_loom_model(f) && f.code.contains(".into_gathered("))
        .map(|f| f.path.as_str())
        .collect();
    assert!(gathering.is_empty(), "{gathering:?} take an unmapped page's reference as a number: only MmuGather may");
}

/// A migrator's bulk copy is `phys::FrozenPage::copy_to`, of a page frozen
/// once a flush's proof is shown. A page-cache page freezes with the
/// cache's reference counted as accounted for only under the cache's lock,
/// which `File::migrate_page` holds: it is the one caller of
/// `FrozenPage::freeze_cached`.
#[test]
fn only_the_page_cache_freezes_a_cached_page() {
    let s = sources();
    let callers: Vec<&str> = s
        .iter()
        .filter(|f| !["file.rs", "phys/frozen.rs"].contains(&f.path.as_str()) && !is_loom_model(f))
        .filter(|f| f.code.contains("freeze_cached("))
        .map(|f| f.path.as_str())
        .collect();
    assert!(callers.is_empty(), "{callers:?} freeze a page-cache page: only the page cache, under its lock, may");
    assert!(
        s.iter().any(|f| f.path == "file.rs" && f.code.contains("FrozenPage::freeze_cached(")),
        "the check finds no freeze of a page-cache page"
    );
}

/// `unsafe` stays in the low layers: of the modules `lib.rs` denies it
/// to, only two override the deny, each for one use that
/// docs/architecture.md's "`unsafe`" lists (`sys/`: passing `mmap_host`'s
/// contract on; `vma/`: the windows' epoch publication). The migrators'
/// bulk copy is `phys::FrozenPage::copy_to`.
#[test]
fn no_feature_module_allows_unsafe_code() {
    let s = sources();
    let allowing: Vec<&str> = s
        .iter()
        .filter(|f| f.code.contains("allow(unsafe_code)") && !["sys/mod.rs", "vma/mod.rs"].contains(&f.path.as_str()))
        .map(|f| f.path.as_str())
        .collect();
    assert!(allowing.is_empty(), "{allowing:?} allow unsafe code above the low layers");
    assert!(
        s.iter().any(|f| f.path == "sys/mod.rs" && f.code.contains("allow(unsafe_code)")),
        "the check finds no override"
    );
}

/// One per-thread numbering: every per-thread slot, shard, stripe and
/// arena takes the thread's number from `sync/percpu.rs`
/// (`this_thread_number`, `this_slot`), so no other file numbers threads
/// itself (a thread-local initialized from a counter of its own).
#[test]
fn threads_are_numbered_in_one_place() {
    let s = sources();
    assert!(
        s.iter().any(|f| f.path == "sync/percpu.rs" && f.code.contains("fn this_thread_number")),
        "the check finds no this_thread_number"
    );
    let numbering: Vec<&str> = s
        .iter()
        .filter(|f| f.path != "sync/percpu.rs" && !is_loom_model(f))
        .filter(|f| {
            f.code.split("thread_local!").skip(1).any(|after| {
                let init = &after[..after.find("\n}").unwrap_or(after.len())];
                init.contains("fetch_add") || init.contains("::take()")
            })
        })
        .map(|f| f.path.as_str())
        .collect();
    assert!(numbering.is_empty(), "{numbering:?} number threads: take crate::sync::percpu::this_thread_number");
}
