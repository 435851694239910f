"""Settings of `rexeval generate llm` (seed 004's prompted generators)."""
from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from rexeval.pipelines.core.llm.job import ChunkedLLMSettings
from rexeval.pipelines.core.outputs import REPORT_OUTPUT, Output, Outputs
from rexeval.pipelines.core.read_paths import ReadPath
from rexeval.pipelines.generate.prompted.methods import PromptedSettings


# What `rexeval generate llm` writes in its folder (pipelines/core/outputs.py).
PROMPTED_OUTPUTS = Outputs(
    explanations=Output("explanations.parquet", "EXPLANATIONS: one row per explained interaction and method"),
    errors=Output("errors.parquet", "each interaction a method could not explain, with the reason"),
    report=Output(REPORT_OUTPUT, "counts, LLM usage, provenance (model, prompt versions, sampling)"),
    table=Output("generate.md", "explanations and errors per method"),
    plans=Output("{method}/plan.parquet", "what each method asks of the LLM"),
    calls=Output("{method}/calls", "each method's resumable LLM chunks", folder=True),
    mf=Output("mf", "the BiasedMF model the item-based methods use", folder=True),
)


class PromptedJob(ChunkedLLMSettings):
    input: ReadPath = Field(description="`rexeval ingest` or `rexeval split` output folder, or a reviews table "
                            "(Parquet, CSV, TSV or JSON lines, gzipped or not)")
    columns: dict[str, str] = Field(default_factory=dict, description="our column name -> yours, for the "
                                    "reviews (e.g. {user_id: reviewer, text: body})")
    methods: list[str] = Field(description="prompted generators by name, one or more (the METHODS registry: "
                               "user_based, item_based, review_extract, review_summary, preference_logic, ...)")
    split: str = Field("test", description="split to explain (split folders only)")
    min_reviews: int = Field(2, ge=1, description="ingest folders: users with this many reviews are explained "
                             "(their latest one)")
    limit: int | None = Field(None, ge=1, description="only the first N interactions")
    settings: PromptedSettings = Field(default_factory=PromptedSettings)
    mf_cpus: float = Field(1.0, gt=0, description="CPUs of the BiasedMF Tune trial")
    mf_gpus: float = Field(0.0, ge=0, description="GPUs of the BiasedMF Tune trial")

    @model_validator(mode="after")
    def _answer_cap(self):
        """Caps the settings leave unset come from the profile's `answer_caps` (seed 004's
        2,048 tokens and whole answers with `paper`); explicit settings win."""
        from rexeval.models.profiles import answer_caps

        caps, given = answer_caps(self.profile), self.settings.model_fields_set
        update = {"max_tokens": caps.explain_tokens} if self.settings.max_tokens is None else {}
        if "max_words" not in given:  # None is a setting here ("keep answers whole"), so unset is checked
            update["max_words"] = caps.explain_words
        if update:
            self.settings = PromptedSettings(**{**self.settings.model_dump(exclude_unset=True), **update})
        return self

    @field_validator("methods")
    @classmethod
    def _known(cls, v: list[str]) -> list[str]:
        from rexeval.pipelines.generate.prompted.methods import METHODS, Method, method_names

        names = []
        for m in dict.fromkeys(x.strip() for x in v):
            if ":" in m:  # a plug-in "package.module:Class": registered here under its own name
                plugin = METHODS.lookup(m)
                if not (isinstance(plugin, type) and issubclass(plugin, Method)) or plugin.name == Method.name:
                    raise ValueError(f"{m}: a prompted generator is a Method subclass with its own `name`")
                names.append(METHODS.add(plugin.name, plugin).name)
                continue
            names.append(m.lower())
        v = list(dict.fromkeys(names))
        if not v:
            raise ValueError(f"give at least one method: {', '.join(method_names())}")
        unknown = [m for m in v if m not in method_names()]
        if unknown:
            raise ValueError(f"unknown method(s) {unknown}: choose from {', '.join(method_names())}")
        return v
