"""The image's CycloneDX SBOM: cyclonedx-py's list of the governor's venv, plus the Debian
packages of the base (from dpkg's status file, before the final stage drops dpkg), as
`pkg:deb` components. Run in the Containerfile's build stage:
    python3 image-sbom.py PYTHON_CDX_JSON DPKG_STATUS OUT_JSON
"""

import json
import sys


def debian_packages(status_text: str) -> list[dict]:
    packages = []
    for stanza in status_text.split("\n\n"):
        fields = {}
        for line in stanza.splitlines():
            if line[:1] in (" ", "\t") or ":" not in line:
                continue
            key, _, value = line.partition(":")
            fields[key] = value.strip()
        if not fields.get("Package") or "installed" not in fields.get("Status", "").split():
            continue
        name, version, arch = fields["Package"], fields.get("Version", ""), fields.get("Architecture", "all")
        packages.append({"type": "library", "name": name, "version": version,
                         "bom-ref": f"pkg:deb/debian/{name}@{version}?arch={arch}",
                         "purl": f"pkg:deb/debian/{name}@{version}?arch={arch}"})
    return sorted(packages, key=lambda c: c["name"])


def main(python_bom: str, status: str, out: str) -> None:
    bom = json.load(open(python_bom))
    with open(status, encoding="utf-8", errors="replace") as text:
        bom.setdefault("components", []).extend(debian_packages(text.read()))
    metadata = bom.setdefault("metadata", {})
    if "component" in metadata:  # the governor's own Python package: one of the image's components
        bom["components"].insert(0, metadata["component"])
    metadata["component"] = {"type": "container", "name": "adl-governor", "bom-ref": "adl-governor-image"}
    with open(out, "w") as target:
        json.dump(bom, target, indent=1, sort_keys=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
