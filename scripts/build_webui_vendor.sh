#!/usr/bin/env bash
# Rebuild mlxcel_py/server/webui/static/vendor/ from npm: the markdown renderer (marked), the
# HTML sanitiser (DOMPurify) and highlight.js core with a few languages, as built ES modules,
# with their licences and a VERSIONS.json. Needs node and npm; run from anywhere:
#   bash scripts/build_webui_vendor.sh
# Bump a version below, run, look at the page (docs/WEBUI.md), commit the vendor folder.
set -euo pipefail

MARKED=18.2.1
DOMPURIFY=3.5.0
HIGHLIGHT=11.12.0
LANGUAGES="bash c cpp css go java javascript json markdown python rust shell sql typescript xml yaml"

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="$ROOT/mlxcel_py/server/webui/static/vendor"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

cd "$WORK"
npm init -y >/dev/null
npm install --no-audit --no-fund --save-exact \
  "marked@$MARKED" "dompurify@$DOMPURIFY" "@highlightjs/cdn-assets@$HIGHLIGHT" >/dev/null
M=node_modules

rm -rf "$OUT"
mkdir -p "$OUT/highlight/languages" "$OUT/LICENSES"
# The source-map comments would point at files we do not ship.
strip_map() { grep -v '^//# sourceMappingURL=' "$1" > "$2"; }
strip_map "$M/marked/lib/marked.esm.js" "$OUT/marked.js"
strip_map "$M/dompurify/dist/purify.es.mjs" "$OUT/purify.js"
strip_map "$M/@highlightjs/cdn-assets/es/core.min.js" "$OUT/highlight/core.js"
for lang in $LANGUAGES; do
  strip_map "$M/@highlightjs/cdn-assets/es/languages/$lang.min.js" "$OUT/highlight/languages/$lang.js"
done
cp "$M/@highlightjs/cdn-assets/styles/github.min.css" "$OUT/highlight/github.css"
cp "$M/@highlightjs/cdn-assets/styles/github-dark.min.css" "$OUT/highlight/github-dark.css"
cp "$M/marked/LICENSE" "$OUT/LICENSES/marked.txt"
cp "$M/dompurify/LICENSE" "$OUT/LICENSES/dompurify.txt"
cp "$M/@highlightjs/cdn-assets/LICENSE" "$OUT/LICENSES/highlight.js.txt"

# What was vendored: versions, licences and the npm integrity of each package.
node - "$OUT" "$LANGUAGES" <<'JS'
const fs = require("fs");
const [out, languages] = process.argv.slice(2);
const lock = JSON.parse(fs.readFileSync("package-lock.json", "utf8")).packages;
const entry = (name, files) => {
  const pkg = lock["node_modules/" + name];
  const meta = JSON.parse(fs.readFileSync(`node_modules/${name}/package.json`, "utf8"));
  return { name, version: pkg.version, license: meta.license, integrity: pkg.integrity, files };
};
const versions = [
  entry("marked", ["marked.js"]),
  entry("dompurify", ["purify.js"]),
  entry("@highlightjs/cdn-assets", ["highlight/core.js", "highlight/github.css", "highlight/github-dark.css",
    ...languages.split(" ").map((l) => `highlight/languages/${l}.js`)]),
];
fs.writeFileSync(`${out}/VERSIONS.json`, JSON.stringify(versions, null, 2) + "\n");
JS
echo "vendored into $OUT:"
du -sh "$OUT"
