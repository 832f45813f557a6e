"""The run's last task: it fails when any task of the run failed, so the run's state is the truth.

Airflow sets a run's state from its leaf tasks. The report runs whatever happened upstream (trigger rule
``all_done``) and succeeds, so with the report as the only leaf a run whose evaluate gate failed was marked
a success (a green badge in the UI, exit 0 from ``airflow dags test``). ``outcome`` runs after the report
(``all_done``, when every other task has finished), reads the run's task states from the Airflow API, and
fails, without retries, naming each failed task with the first lines of its error
(eagle3.report.failures) and each task that did not run because of it.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseOperator

FAILED = ("failed", "upstream_failed")


def run_task_states(context) -> dict[tuple[str, int], str]:
    """{(task_id, map_index): state} of every other task instance of this run (the Task SDK API)."""
    dag, ti = context["dag"], context["ti"]
    found = ti.get_task_states(dag_id=dag.dag_id, run_ids=[context["run_id"]])
    task_ids = set(dag.task_ids)
    out = {}
    for key, state in (found.get(context["run_id"]) or {}).items():
        if key in task_ids:  # mapped instances come back as "<task_id>_<map_index>"
            task_id, index = key, -1
        else:
            task_id, _, i = key.rpartition("_")
            if task_id not in task_ids or not i.isdigit():
                continue
            index = int(i)
        if task_id != ti.task_id:
            out[(task_id, index)] = state
    return out


def describe(states: dict[tuple[str, int], str], errors: dict[tuple[str, int], dict]) -> list[str]:
    """One line per task that failed (with its error's first line) or did not run because of one."""
    from eagle3.report.failures import label

    lines = []
    for (task_id, index), state in sorted(states.items(), key=lambda kv: (kv[1] != "failed", kv[0])):
        if state not in FAILED:
            continue
        rec = errors.get((task_id, index)) or {}
        name = label(task_id, index, rec.get("name"))
        if state == "failed":
            why = (rec.get("lines") or [])[:1]
            lines.append(f"{name} failed" + (f": {rec.get('error')}: {why[0]}" if why else ""))
        else:
            lines.append(f"{name} did not run: an upstream task failed")
    return lines


class OutcomeOperator(BaseOperator):
    """Fail (no retry) when any other task of the run failed; succeed otherwise.

    :param root: the storage root (eagle3.layout), where the failed tasks' errors are kept.
    """

    template_fields = ("root",)
    ui_color = "#f3f3f3"

    def __init__(self, *, root: str, **kwargs: Any) -> None:
        kwargs.setdefault("retries", 0)
        super().__init__(**kwargs)
        self.root = root

    def execute(self, context) -> dict:
        from airflow.sdk.exceptions import AirflowFailException

        from eagle3.layout import RunLayout
        from eagle3.report import failures

        from eagle3 import storage
        from operators.hooks import Eagle3StorageHook

        storage.configure_s3(Eagle3StorageHook().settings)  # an s3 root's error files, as the tasks wrote them
        states = run_task_states(context)
        errors = failures.read(RunLayout(self.root, context["dag"].dag_id, context["run_id"]))
        lines = describe(states, errors)
        if lines:
            raise AirflowFailException("the run failed:\n  " + "\n  ".join(lines))
        counts: dict[str, int] = {}
        for state in states.values():
            counts[state] = counts.get(state, 0) + 1
        self.log.info("every task succeeded or was skipped: %s", counts)
        return {"states": counts}
