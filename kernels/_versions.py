"""The version switch every family module shares: ``rebind(module_globals, VERSIONS, DEFAULTS,
version)`` binds each public name that has ``version`` to it ("default" restores DEFAULTS)."""


def rebind(module_globals, versions, defaults, version):
    family = module_globals["__name__"].rpartition(".")[2]
    if version == "default":
        for fn, ver in defaults.items():
            module_globals[fn] = versions[fn][ver]
        return
    hit = [fn for fn, table in versions.items() if version in table]
    if not hit:
        known = sorted({v for table in versions.values() for v in table})
        raise ValueError(
            f"kernel family '{family}' has no version '{version}'; known: {', '.join(known)} (or 'default')"
        )
    for fn in hit:
        module_globals[fn] = versions[fn][version]


def current(module_globals, versions):
    """{public name: version name currently bound}."""
    out = {}
    for fn, table in versions.items():
        for ver, f in table.items():
            if module_globals.get(fn) is f:
                out[fn] = ver
                break
    return out
