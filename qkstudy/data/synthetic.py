"""The embedded default corpus: seeded simple English stories (a cast, a setting, a plot arc)
from the word lists and templates in stories.json: a small vocabulary, very many distinct
sentences. Same seed -> identical stories; story i does not depend on how many are asked for."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

# Animal heroes have their own names, so "a rabbit named Ben" and "a boy named Ben" both occur.
# Each plot holds its problem sentences, the lines said, failed attempts, ideas and resolutions.
WORDS: dict = json.loads(Path(__file__).with_name("stories.json").read_text(encoding="utf-8"))


def _article(phrase: str) -> str:
    return ("an " if phrase[0] in "aeiou" else "a ") + phrase


PRONOUN_SLOTS = ("he", "him", "his", "himself")  # template slots, filled with the hero's


def _character(rng: random.Random, taken: set[str]) -> dict[str, str]:
    while True:
        roll = rng.random()
        if roll < 0.35:
            name, kind, she = rng.choice(WORDS["girls"]), "girl", True
        elif roll < 0.7:
            name, kind, she = rng.choice(WORDS["boys"]), "boy", False
        else:
            name, kind = rng.choice(WORDS["animal_names"]), rng.choice(WORDS["animals"])
            she = rng.random() < 0.5
        if name not in taken:
            taken.add(name)
            break
    pronouns = ("she", "her", "her", "herself") if she else ("he", "him", "his", "himself")
    return {"name": name, "kind": kind, **dict(zip(PRONOUN_SLOTS, pronouns, strict=True))}


def _slots(rng: random.Random) -> dict[str, str]:
    def pick(key: str):
        return rng.choice(WORDS[key])

    taken: set[str] = set()
    hero, friend = _character(rng, taken), _character(rng, taken)
    grownup = pick("grown_ups")
    skill, did_skill, oops = pick("skills")
    scare, truth = pick("scares")
    s = {
        "hero": hero["name"], "kind": hero["kind"], "friend": friend["name"],
        "a_fkind": _article(friend["kind"]),
        **{key: hero[key] for key in PRONOUN_SLOTS}, "grownup": grownup,
        "grownup_lower": grownup if grownup[0].isupper() and " " in grownup else grownup.lower(),
        "adj": pick("adj_hero"), "adj2": pick("adj_hero"), "color": pick("colors"),
        "toy": pick("toys"), "fly": pick("flyable"), "place": pick("places"),
        "place_adj": pick("place_adj"), "home": pick("homes"), "time": pick("times"),
        "food": pick("foods"), "high": pick("high"), "tool": pick("tools"),
        "fix": pick("fixes"), "build": pick("builds"), "stray": pick("strays"),
        "bad": pick("feel_bad"), "good": pick("feel_good"), "good2": pick("feel_good"),
        "say": pick("say"), "skill": skill, "did_skill": did_skill, "oops": oops,
        "scare": scare, "truth": truth,
    }
    # Slots that themselves contain {his} etc. are filled once the pronouns are known.
    s["hobby"], s["hobby2"] = (h.format_map(s) for h in rng.sample(WORDS["hobbies"], 2))
    for key in ("skill", "truth"):
        s[key] = s[key].format_map(s)
    s["lostspot"] = pick("lost_spots").format_map(s)
    s["search1"], s["search2"] = (x.format_map(s) for x in rng.sample(WORDS["search_spots"], 2))
    s["said_by_friend"] = f"{friend['name']} {pick('say')}."
    for key in ("he", "his"):
        s[key.capitalize()] = s[key].capitalize()
    return s


def _fill(template: str, s: dict[str, str]) -> str:
    text = template.format_map(s)
    return text[0].upper() + text[1:]


def story(rng: random.Random) -> str:
    s = _slots(rng)
    plot = WORDS["plots"][rng.choice(sorted(WORDS["plots"]))]
    pick = rng.choice

    def say(lines: list[str], forms: list[str]) -> str:
        s["line"] = pick(lines).format_map(s)
        return pick(forms)

    intro = [pick(WORDS["openings"]), *rng.sample(WORDS["traits"], rng.randint(1, 2)),
             pick(WORDS["settings"])]
    trouble = [pick(plot["problem"]), say(plot["line"], WORDS["worried_dialogue"]),
               "{hero} felt {bad}.", *rng.sample(plot["fail"], rng.randint(1, 2))]
    # Each sentence is filled at once because `line` changes between the two dialogues.
    trouble = [_fill(t, s) for t in trouble]
    # The idea and the resolution are written in matching order, so the turn stays coherent.
    idea = rng.randrange(len(plot["idea"]))
    turn = [plot["idea"][idea], plot["solve"][idea]]
    if rng.random() < 0.5:
        turn.append(say(WORDS["happy_lines"], WORDS["dialogue"]))
    ending = [pick(WORDS["endings"])] + ([pick(WORDS["morals"])] if rng.random() < 0.3 else [])

    intro, turn, ending = ([_fill(t, s) for t in part] for part in (intro, turn, ending))
    paragraphs = [intro, trouble, *([turn + ending] if rng.random() < 0.5 else [turn, ending])]
    return "\n".join(" ".join(para) for para in paragraphs)


def iter_stories(seed: int) -> Iterator[str]:
    rng = random.Random(seed)
    while True:
        yield story(rng)


def iter_text(n_chars: int, seed: int) -> Iterator[str]:
    total = 0
    for text in iter_stories(seed):
        if total >= n_chars:
            return
        total += len(text)
        yield text


def generate_text(n_chars: int, seed: int) -> list[str]:
    return list(iter_text(n_chars, seed))
