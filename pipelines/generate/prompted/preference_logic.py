"""PreferenceLogic (seed 004, §5.1 and appendix A.1): the LLM links the shopper's
purchase history to the item's attributes. It is the baseline every other system's win
rate is measured against, and the generator of the inferior-explanation detection test
(`pipelines/judge/detect.py` writes its original explanations with `conversation` and
its prompt-interruption ones with the same prompt and one flawed style rule).

Context: `core.context.build_contexts` over the known reviews: the user's purchases strictly
before the interaction (most recent first, at most `max_history`) and the item's title,
or what other buyers wrote in their headlines (never the target user's words). An empty
history is allowed: the prompt says the shop knows no earlier purchase.
"""
from __future__ import annotations

from rexeval.pipelines.generate.prompted.methods import PromptedMethod, PromptedSettings, register_method

PROMPT = "explain_recommendation"
STYLE = "explanation_style"


def preference_prompt(prompt: str = PROMPT, style: str = STYLE, prompts_dir: str | None = None):
    """(template, style rubric) of PreferenceLogic."""
    from rexeval.prompts import load_prompt
    from rexeval.prompts.rubrics import load_rubric

    return load_prompt(prompt, prompts_dir), load_rubric(style, prompts_dir)


def conversation(template, user_profile: str, item_description: str, rules: list) -> list[dict[str, str]]:
    """The messages that ask for one explanation under the given style rules."""
    return template.render(user_profile=user_profile, item_description=item_description, style_rules=rules)


@register_method("preference_logic")
class PreferenceLogic(PromptedMethod):
    """The LLM links the shopper's purchase history to the item (the baseline of seed
    004's win rates)."""

    prompt = PROMPT
    asked_words = "20 to 30"
    conditions_on = ("the user's purchases before the interaction (most recent first, ≤ 10) and the item's "
                     "description (`explain_recommendation` with the `explanation_style` rules; the detection "
                     "test uses this same generator). A user with no earlier purchase (e.g. every review on the "
                     "same day) gets a prompt that says so, as seed 004's baseline would, where item-based gives "
                     "`no_history`")
    never_sees = "the explained review"

    def template(self):
        return preference_prompt()  # the prompt and its style rules

    def fill(self, target, context, settings: PromptedSettings, state=None):
        values = {"user_profile": context.user_profile, "item_description": context.item_description}
        return values, dict(values)

    def render(self, template, variables: dict) -> list[dict]:
        prompt, style = template
        return conversation(prompt, variables["user_profile"], variables["item_description"], list(style.items))

    def version(self, template) -> str:
        prompt, style = template
        return f"{prompt.version}+{style.version}"
