"""The one operator shape: build the stage's Config from the rendered fields, make one core call.

    Eagle3StageOperator(task_id="merge", stage="merge", root="{{ params.storage_root }}",
                        config={"prepared": ..., "max_seq_len": "{{ params.max_seq_len }}", ...})

The DAG renders templates as native objects, so a Param keeps its type from the form to
the Config (an int stays an int); the Config validates and refuses unknown keys before
anything runs. Light stages run in the task process; stages that load the target or a GPU
(eagle3.stages) run ``eagle3 <stage> --config CFG.json --result RESULT.json`` in a supervised
child that ``on_kill`` stops. Either way the result comes back the same way: the stage's
summary dict, kept in the run's ``summaries/<task_id>[.<map_index>].json`` (eagle3.layout,
what the report reads) and pushed to XCom when small. A failure is kept too, in
``errors/<task_id>[.<map_index>].json`` (eagle3.report.failures: its first lines are what the
report, the UI page and the demo print), and removed when a retry succeeds.
"""

from __future__ import annotations

import json
import os
import tempfile
from datetime import datetime, timezone
from functools import cached_property
from typing import Any

from airflow.sdk import BaseOperator

from operators.hooks import Eagle3StorageHook
from operators.retry import EAGLE3_RETRY_POLICY
from operators.supervised import SupervisedProcess, eagle3_cli

XCOM_LIMIT = 16 * 1024  # larger results stay in the run folder; XCom gets their path (issue #64628)


class Eagle3StageOperator(BaseOperator):
    """Run one eagle3 stage.

    :param stage: the stage's name (eagle3.stages): module ``eagle3.<stage>``, function ``<stage>(cfg)``.
    :param config: the stage Config's fields (templated; rendered as native objects).
    :param mapped: fields that differ per mapped task instance (``.expand(mapped=...)``); they override
        ``config``.
    :param root: the storage root (eagle3.layout); the result goes to the run's summaries folder there.
    :param s3_conn_id: the aws-type connection for ``s3://`` paths (eagle3_s3; ignored when missing).
    """

    template_fields = ("config", "mapped", "root")
    ui_color = "#e8f1ff"

    def __init__(self, *, stage: str, config: dict[str, Any], root: str, mapped: dict[str, Any] | None = None,
                 s3_conn_id: str | None = Eagle3StorageHook.default_conn_name, **kwargs: Any) -> None:
        kwargs.setdefault("retry_policy", EAGLE3_RETRY_POLICY)
        super().__init__(**kwargs)
        from eagle3.stages import stage as lookup

        self.stage = lookup(stage).name
        self.config, self.mapped, self.root, self.s3_conn_id = config, mapped, root, s3_conn_id
        self._proc: SupervisedProcess | None = None

    @cached_property
    def storage_hook(self) -> Eagle3StorageHook:
        return Eagle3StorageHook(self.s3_conn_id)

    # -- hooks for the few stages that need more ---------------------------------------------
    def child_env(self, cfg) -> dict[str, str]:
        """Environment added for a subprocess stage (connections' settings; never this process's env)."""
        return self.storage_hook.child_env()

    def child_args(self, cfg) -> list[str]:
        """CLI flags that are not Config fields (e.g. train's --nproc)."""
        return []

    def after(self, result: dict, context) -> dict:
        """Look at the result before it is kept (e.g. skip the task); returns what is kept."""
        return result

    # -- the one shape -------------------------------------------------------------------------
    def build_config(self):
        from eagle3.config import from_dict
        from eagle3.stages import stage

        return from_dict(stage(self.stage).config_class(), {**(self.config or {}), **(self.mapped or {})},
                         where=f"{self.task_id}.config")

    def execute(self, context) -> Any:
        from eagle3 import storage
        from eagle3.stages import stage

        storage.configure_s3(self.storage_hook.settings)
        try:
            cfg = self.build_config()
            if stage(self.stage).subprocess:
                result = self._run_child(cfg)
            else:
                result = stage(self.stage).function()(cfg)
            result = self.after(result, context)
        except Exception as e:
            from airflow.sdk.exceptions import AirflowSkipException

            if not isinstance(e, AirflowSkipException):
                self._keep_error(e, context)
            raise
        return self._keep(result, context)

    def _layout(self, context):
        from eagle3.layout import RunLayout

        return RunLayout(self.root, context["dag"].dag_id, context["run_id"])

    def _keep_error(self, error: BaseException, context) -> None:
        from eagle3.report import failures

        ti = context["ti"]
        try:
            name = self.render_template(self.map_index_template, context) if self.map_index_template else None
            failures.write(self._layout(context), self.task_id, getattr(ti, "map_index", -1),
                           getattr(ti, "try_number", None), error, name=None if name is None else str(name))
        except Exception as e:  # noqa: BLE001 (the task's own error is what must surface)
            self.log.warning("could not keep the error in the run folder: %s", e)

    def _run_child(self, cfg) -> dict:
        from eagle3 import storage
        from eagle3.config import to_dict

        with tempfile.TemporaryDirectory(prefix=f"eagle3-{self.stage}-") as tmp:
            config_path, result_path = os.path.join(tmp, "config.json"), os.path.join(tmp, "result.json")
            with open(config_path, "w") as f:
                json.dump(to_dict(cfg), f)
            argv = eagle3_cli(self.stage, "--config", config_path, "--result", result_path, *self.child_args(cfg))
            self._proc = SupervisedProcess(argv, env=self.child_env(cfg), log=self.log)
            self._proc.run()
            return storage.read_json(result_path)

    def _keep(self, result: dict, context) -> Any:
        from eagle3 import storage
        from eagle3.report import failures

        ti = context["ti"]
        layout = self._layout(context)
        uri = layout.task_result(self.task_id, getattr(ti, "map_index", -1))
        storage.write_json(uri, result)
        failures.clear(layout, self.task_id, getattr(ti, "map_index", -1))
        text = json.dumps(result, default=str)
        return json.loads(text) if len(text) <= XCOM_LIMIT else {"result_file": uri, "bytes": len(text)}

    def on_kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()


class RegenerateOperator(Eagle3StageOperator):
    """Regenerate one dataset. With backend ``openai`` the endpoint and key come from the connection
    ``openai_conn_id`` (host = base URL, password = key), passed to the child's environment only;
    with ``server`` (vllm, sglang) the stage serves the model itself for the task and stops it after.
    ``restart`` (the regenerate_restart Param) discards earlier answers on the first try only: a retry
    resumes what the first try regenerated.

    :param openai_conn_id: the endpoint's connection (used when the rendered backend is ``openai``).
    """

    def __init__(self, *, openai_conn_id: str = "eagle3_openai", **kwargs: Any) -> None:
        kwargs.setdefault("stage", "regenerate")
        super().__init__(**kwargs)
        self.openai_conn_id = openai_conn_id

    def execute(self, context) -> Any:
        if self.config.get("restart") and getattr(context["ti"], "try_number", 1) > 1:
            self.log.info("retry %s: resuming the answers the first try regenerated (restart only on try 1)",
                          context["ti"].try_number)
            self.config = {**self.config, "restart": False}
        return super().execute(context)

    def child_env(self, cfg) -> dict[str, str]:
        env = super().child_env(cfg)
        if cfg.backend == "openai" and not cfg.base_url and not cfg.server:  # a server of its own: no connection
            from operators.hooks import OpenAIEndpointHook

            env.update(OpenAIEndpointHook(self.openai_conn_id).child_env())
        return env


class TrainOperator(Eagle3StageOperator):
    """Train under torchrun with ``nproc`` processes (pool ``gpu`` with pool_slots = nproc).

    :param run_time_budget: seconds the whole DAG run should take (templated; 0: none). Training then ends by the
        run's start + run_time_budget - after_train_reserve (TrainConfig.train_deadline), or runs
        train_time_budget, whichever is longer (eagle3/train/budget.py).
    :param after_train_reserve: seconds kept for the tasks after train (templated).
    :param reserve_tokens_per_s: the extraction rate (target tokens/s) at which after_train_reserve was sized
        (templated; 0: the reserve as given). This run's extract shards' measured rate then scales it
        (eagle3.train.budget.scaled_reserve): a machine that runs the target faster evaluates faster too, so it
        keeps less and trains longer.
    :param extract_task_id: the task whose results (the run's summaries) hold the extraction rate.
    """

    template_fields = (*Eagle3StageOperator.template_fields, "run_time_budget", "after_train_reserve",
                       "reserve_tokens_per_s")

    def __init__(self, *, nproc: int = 1, run_time_budget: Any = 0, after_train_reserve: Any = 0,
                 reserve_tokens_per_s: Any = 0, extract_task_id: str = "extract", **kwargs: Any) -> None:
        kwargs.setdefault("stage", "train")
        super().__init__(**kwargs)
        self.nproc = nproc
        self.run_time_budget, self.after_train_reserve = run_time_budget, after_train_reserve
        self.reserve_tokens_per_s, self.extract_task_id = reserve_tokens_per_s, extract_task_id

    def execute(self, context) -> Any:
        self._run_start = getattr(context.get("dag_run"), "start_date", None)
        self._summaries = self._layout(context).summaries  # read in build_config, once storage is configured
        return super().execute(context)

    def _extraction_rate(self) -> float | None:
        """This run's extraction rate from its extract shards' kept results; None (and why, logged) if none."""
        from eagle3.report.collect import task_results
        from eagle3.train.budget import extraction_rate

        folder = getattr(self, "_summaries", None)
        shards = task_results(folder).get(self.extract_task_id) if folder else None  # unreadable ones: logged, None
        results = [r for r in ([shards] if isinstance(shards, dict) else shards or []) if isinstance(r, dict)]
        rate = extraction_rate(results)
        if rate is None:
            self.log.info("no extraction ran in this run (%d %s results in %s): the after-train reserve is kept "
                          "as given", len(results), self.extract_task_id, folder)
        return rate

    def build_config(self):
        from eagle3.errors import InputError
        from eagle3.train.budget import run_deadline, scaled_reserve

        budget, reserve = float(self.run_time_budget or 0), float(self.after_train_reserve or 0)
        if budget > 0 and reserve >= budget:
            raise InputError(f"run_time_budget={budget:g} s leaves nothing for training after after_train_reserve="
                             f"{reserve:g} s: raise run_time_budget, lower after_train_reserve, or set "
                             f"run_time_budget 0 (train_time_budget alone)")
        start = getattr(self, "_run_start", None)
        if budget > 0 and start is not None:
            sized_at = float(self.reserve_tokens_per_s or 0)
            measured = self._extraction_rate() if sized_at > 0 and reserve > 0 else None
            kept = scaled_reserve(reserve, sized_at, measured)
            if kept != reserve:
                self.log.info("after-train reserve %.0f s, sized at %.0f tok/s of extraction; this run extracted at "
                              "%.0f tok/s: %.0f s kept", reserve, sized_at, measured, kept)
            deadline = run_deadline(start.timestamp(), budget, kept)
            self.config = {**self.config, "train_deadline": deadline}
            self.log.info("run time budget %.0f s from %s, %.0f s kept after train: training runs until %s, or for "
                          "train_time_budget if that ends later", budget, start.isoformat(), kept,
                          datetime.fromtimestamp(deadline, timezone.utc).isoformat())
        return super().build_config()

    def child_args(self, cfg) -> list[str]:
        # `eagle3 train --nproc` runs torchrun itself and keeps the exit codes (75 OOM, 2 bad input).
        return ["--nproc", str(self.nproc)] if self.nproc > 1 else []


class PublishOperator(Eagle3StageOperator):
    """Publish the draft, and emit the outlets' Asset events, only if it beats the best so far."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("stage", "publish")
        super().__init__(**kwargs)

    def after(self, result: dict, context) -> dict:
        from airflow.sdk.exceptions import AirflowSkipException

        if not result.get("published"):
            self._keep(result, context)  # the report shows why
            raise AirflowSkipException(f"not published: {result.get('reason')}")  # also suppresses the Asset event
        for outlet in self.outlets:
            context["outlet_events"][outlet].extra = {k: result.get(k) for k in ("location", "acceptance_length")}
        return result


class VerifyOperator(Eagle3StageOperator):
    """The verify gate; also pushes the training mode it chose (XCom key ``training_mode``: offline or online)
    and the training micro-batch that fits the device (``train_token_budget``), which the extract and train
    templates read."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("stage", "verify")
        super().__init__(**kwargs)

    def after(self, result: dict, context) -> dict:
        context["ti"].xcom_push(key="training_mode", value=result["training_mode"]["mode"])
        context["ti"].xcom_push(key="train_token_budget", value=result["train_token_budget"])
        return result


class ExtractOperator(Eagle3StageOperator):
    """One extraction shard; skipped when verify chose online training (the target then runs inside train).

    :param online: verify's choice as a bool (templated).
    """

    template_fields = (*Eagle3StageOperator.template_fields, "online")

    def __init__(self, *, online: Any = False, **kwargs: Any) -> None:
        kwargs.setdefault("stage", "extract")
        super().__init__(**kwargs)
        self.online = online

    def execute(self, context) -> Any:
        if self.online is True:
            from airflow.sdk.exceptions import AirflowSkipException

            raise AirflowSkipException("verify chose online training: the target runs inside train, no store")
        return super().execute(context)


class ReportOperator(Eagle3StageOperator):
    """The run's report, with the state of every other task at this moment (``task_states``), so the report
    names what failed or was skipped."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("stage", "report")
        super().__init__(**kwargs)

    def execute(self, context) -> Any:
        from operators.outcome import run_task_states

        try:
            states = [{"task_id": t, "map_index": i, "state": s} for (t, i), s in run_task_states(context).items()]
        except Exception as e:  # noqa: BLE001 (the report is written without them)
            self.log.warning("could not read the run's task states: %s", e)
            states = None
        self.config = {**self.config, "task_states": states}
        return super().execute(context)
