"""A bounded schemathesis run over /openapi.json: no request makes the server fail."""

import json
import subprocess
import sys
from pathlib import Path

from stress_helpers import record, serving

CHECKS = "not_a_server_error,content_type_conformance,negative_data_rejection,status_code_conformance," \
         "response_schema_conformance"
BUDGET_S = 240  # schemathesis repeats fuzzing until its time budget is spent
MAX_EXAMPLES = 100
CONFIG = Path(__file__).with_name("schemathesis.toml")  # the 501 of the routes that always refuse is expected


def test_schemathesis_finds_no_server_error(model_path, tmp_path):
    report = tmp_path / "schemathesis.json"
    with serving(model_path, "-np", "2", "-c", "1024", "--api-key", "stress-key") as child:
        cli = Path(sys.executable).with_name("schemathesis")
        run = subprocess.run(
            [str(cli), "--config-file", str(CONFIG), "run", child.url + "/openapi.json", "-H", "Authorization: Bearer stress-key",
             "--checks", CHECKS, "-n", str(MAX_EXAMPLES), "--max-time", str(BUDGET_S), "--seed", "10",
             "--workers", "2", "--request-timeout", "60", "--no-color",
             "--report", "json", "--report-json-path", str(report)],
            capture_output=True, text=True, timeout=BUDGET_S + 180,
        )
    result = json.loads(report.read_text())
    cases = result["test_cases"]
    record("schemathesis", operations=result["operations"]["tested"], cases=cases["generated"],
           failures=cases["with_failures"], errored=cases["errored"], seconds=round(result["running_time"]))
    assert run.returncode == 0 and cases["with_failures"] == 0 and cases["errored"] == 0, run.stdout[-8000:]
    assert result["operations"]["tested"] == 34 and cases["generated"] >= 500
