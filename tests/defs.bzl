"""host_test: a doctest cc_test of the host path (no CUDA)."""

load("//bazel:copts.bzl", "FSDP_COPTS", "FSDP_LINKOPTS")

# The libraries with sources, and their separate-compilation counterparts.
_SEPARATE = {
    "//:checkpoint": "//:checkpoint_separate",
}

# The tag of a test that unity_tests() compiles with the other tests of its package (and "manual": `bazel test //...`
# runs the package's unity test instead; naming the test still builds and runs it alone).
_MEMBER = "unity_member"
_GROUP = "unity_group="

def _member_tags(unity, kwargs):
    if unity == False or kwargs.get("args") or kwargs.get("env"):
        return []
    return ["manual", _MEMBER] + ([_GROUP + unity] if type(unity) == "string" else [])

def host_test(name, srcs, deps = [], size = "small", copts = [], header_only = False, unity = True, **kwargs):
    """A host test, compiled in separate-compilation mode unless `header_only`.

    Separate mode (//:fsdp_separate, docs/build.md): the library's non-template definitions and the host model core
    on comm::local (its executor and optimizers) are compiled once, in fsdp/src.hpp's one file, for every test; a
    test file parses their declarations only and compiles what it instantiates itself (its policies' Model shells,
    other backends and communicators). Each test file compiles in about two thirds of its header-only time. The
    code is the same in both modes (example_test and port_modes_test compare programs built both ways byte for byte;
    CMake's tests, the examples and the consumer are header-only). `header_only`: the library's default mode, as a
    user's first file is built (readme_test), with the host core compiled once by //tests/support:instances.

    `unity`: the test joins its package's unity test (unity_tests() below, which the package's BUILD calls last)
    unless it takes `args` or `env`; a string names a group of the package's tests that is compiled apart (tests
    that run long, so that their binary starts early and does not wait on the rest).
    """
    tags = kwargs.pop("tags", [])
    if header_only:
        library = ["//:fsdp", "//tests/support:instances"]
    else:
        library = ["//:fsdp_separate"]
        deps = [_SEPARATE.get(d, d) for d in deps]
    native.cc_test(
        name = name,
        srcs = srcs,
        copts = FSDP_COPTS + copts,
        linkopts = FSDP_LINKOPTS,
        deps = deps + library + [
            "//tests/support",
            "@doctest",
        ],
        size = size,
        tags = tags + _member_tags(unity, kwargs),
        **kwargs
    )

_SIZES = ["small", "medium", "large", "enormous"]

def _label(package, label):
    if label.startswith("//") or label.startswith("@"):
        return label
    return "//" + package + ":" + label.lstrip(":")

def _name(rule):
    return rule["name"]

def unity_tests():
    """One cc_test for the host tests of this package that agree on tags, copts, library (separate or header-only) and
    group (host_test's `unity`), called last in a BUILD.

    The test files are one translation unit (bazel/unity_source.sh: each file in a namespace of its own, its lines
    numbered as in the source), so what they share is parsed and instantiated once: the unity test of tests/model
    compiles in about a third of the time its 15 files take one by one under ASan. The test is named after the package
    (`model_tests`; a group with tags of its own adds them: `model_sweep_tests`), has the members' tags, sources,
    dependencies and data, and the largest member's size, one larger where it holds more than one test (they run in
    turn). The members stay targets of their own, tagged "manual": `bazel test //tests/model:parity_test` runs one.
    """
    package = native.package_name()
    groups = {}
    order = []
    for rule in native.existing_rules().values():
        if rule["kind"] != "cc_test" or _MEMBER not in rule["tags"]:
            continue
        tags = sorted([t for t in rule["tags"] if t not in ("manual", _MEMBER)])
        library = [d for d in rule["deps"] if _label(package, d) in ("//:fsdp", "//:fsdp_separate")]
        key = "|".join(tags) + "#" + " ".join(rule["copts"]) + "#" + " ".join(library)  # the group's tag among tags
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(rule)
    base = package.split("/")[-1]
    names = {}
    for key in order:
        members = sorted(groups[key], key = _name)
        tags = sorted([t for t in members[0]["tags"] if t not in ("manual", _MEMBER) and not t.startswith(_GROUP)])
        group = [t[len(_GROUP):] for t in members[0]["tags"] if t.startswith(_GROUP)]
        name = "_".join([base] + group + tags + ["tests"])
        if name in names:
            fail(("unity_tests: two groups of //%s would both be named %s (their copts or library differ): " +
                  "give one of them host_test's `unity = \"GROUP\"`") % (package, name))
        names[name] = True
        if len(members) == 1:
            # Nothing to share: the test itself, as `bazel test //...` expands a suite. The suite carries the test's
            # tags: a config's --build_tag_filters pass over a suite by its own tags, and an untagged suite made the
            # sanitizer configs build example_test and port_modes_test ("build_modes", with the GPT example's main
            # and the port example in both modes: about 100 s of compiles each config) that they then did not run.
            # (A suite's tags also select among its tests; the one test has them all.)
            native.test_suite(name = name, tests = [":" + members[0]["name"]], tags = tags)
            continue
        sources, others, deps, data = [], [], [], []
        size = 0
        for r in members:
            for s in r["srcs"]:
                label = _label(package, s)
                if label.endswith(".cc"):
                    sources.append(label)
                elif label not in others:
                    others.append(label)
            for d in r["deps"]:
                if _label(package, d) not in deps:
                    deps.append(_label(package, d))
            for d in r["data"]:
                if _label(package, d) not in data:
                    data.append(_label(package, d))
            size = max(size, _SIZES.index(r["size"]))
        size = min(size + 1, len(_SIZES) - 1)
        native.genrule(
            name = name + "_source",
            srcs = sources,
            outs = [name + "_unity.cc"],
            cmd = "$(location //bazel:unity_source.sh) $@ $(SRCS)",
            tools = ["//bazel:unity_source.sh"],
            testonly = True,
        )
        native.cc_test(
            name = name,
            srcs = [":" + name + "_unity.cc"] + others,
            copts = members[0]["copts"],
            linkopts = FSDP_LINKOPTS,
            deps = deps,
            data = data,
            size = _SIZES[size],
            tags = tags,
        )
