"""The embedded default corpus: seeded simple English stories (a cast, a setting, a plot arc)
from word lists and templates: a small vocabulary, very many distinct sentences. Same seed ->
identical stories; story i does not depend on how many are asked for."""

from __future__ import annotations

import random
from collections.abc import Iterator

GIRLS = ["Lily", "Mia", "Emma", "Zoe", "Ava", "Nora", "Ruby", "Lucy", "Ella", "Rosa", "Ivy",
         "Maya", "Chloe", "Hana", "Sara", "Amara", "Poppy", "Daisy", "Greta", "Luna", "Nina",
         "Olive", "Tara", "Wren"]
BOYS = ["Tom", "Ben", "Max", "Leo", "Sam", "Jack", "Finn", "Omar", "Eli", "Noah", "Theo", "Kai",
        "Ravi", "Hugo", "Milo", "Oscar", "Felix", "Jonah", "Arlo", "Ezra", "Luca", "Pablo", "Toby",
        "Yuki"]
# Animal heroes get their own names so "a rabbit named Ben" and "a boy named Ben" both occur.
ANIMALS = ["rabbit", "bunny", "puppy", "kitten", "bear", "fox", "duck", "frog", "mouse",
           "squirrel", "owl", "turtle", "pig", "lamb", "goat", "hedgehog", "otter", "panda",
           "penguin", "tiger cub", "lion cub", "deer", "robin", "beaver"]
ANIMAL_NAMES = ["Pip", "Bongo", "Tilly", "Whiskers", "Fluff", "Biscuit", "Pebble", "Coco",
                "Nutmeg", "Sunny", "Bubbles", "Ziggy", "Hazel", "Clover", "Maple", "Rusty",
                "Button", "Dot", "Mochi", "Pickles", "Bramble", "Juniper", "Socks", "Waffles"]
GROWN_UPS = ["Mom", "Dad", "Grandma", "Grandpa", "Aunt May", "Uncle Joe", "Miss Green",
             "Mr. Brown"]

ADJ_HERO = ["little", "happy", "curious", "kind", "brave", "shy", "silly", "clever", "cheerful",
            "busy", "gentle", "small", "playful", "quiet", "friendly", "sleepy"]
COLORS = ["red", "blue", "green", "yellow", "purple", "orange", "pink", "shiny", "striped",
          "spotted", "old", "new", "tiny", "big", "soft", "bright"]
TOYS = ["ball", "kite", "teddy bear", "toy car", "doll", "boat", "drum", "book", "puzzle",
        "balloon", "hat", "scarf", "robot", "train", "whistle", "yo-yo", "spinning top", "bucket",
        "shovel", "crayon box"]
FLYABLE = ["kite", "ball", "balloon", "hat", "scarf", "paper plane", "frisbee", "sock"]
PLACES = ["park", "garden", "beach", "forest", "farm", "meadow", "river bank", "playground",
          "hill", "market", "lake", "village square", "orchard", "backyard", "zoo", "library"]
PLACE_ADJ = ["big", "quiet", "green", "sunny", "busy", "small", "pretty", "windy", "old"]
HOMES = ["in a little house near the woods", "in a small town by the sea",
         "in a big city full of lights", "on a farm with many cows", "in a cozy hole under a tree",
         "in a yellow house with a red door", "near a river that sang all day",
         "at the top of a green hill", "in a village with a tall clock",
         "in a tree house by the pond"]
TIMES = ["One sunny morning", "One day", "One afternoon", "Early one morning",
         "One warm summer day", "One cold winter morning", "One windy afternoon",
         "On a bright spring day", "One evening", "Last Saturday", "One cloudy day"]
HOBBIES = ["play with {his} {toy}", "sing songs", "draw pictures", "run in the grass",
           "jump in puddles", "look at the stars", "build things with blocks",
           "read books about the sea", "dance to music", "pick flowers", "count the clouds",
           "help {his} {grownup_lower}", "splash in the water", "climb small trees",
           "collect pretty stones", "bake cookies"]
FOODS = ["apples", "cookies", "carrots", "berries", "sandwiches", "honey cakes", "cheese",
         "bananas", "pancakes", "soup", "nuts", "grapes"]
HIGH = ["a tall tree", "the roof of the barn", "a high fence", "the top of a lamp post",
        "a big bush full of thorns", "the branch of an old oak"]
LOST_SPOTS = ["under the bed", "behind the sofa", "in the toy box", "under a big leaf",
              "in the tall grass", "next to the door", "inside {his} boot", "under the table",
              "in the basket", "behind the flower pot"]
SEARCH_SPOTS = ["in the kitchen", "under the chair", "in the garden", "behind the curtain",
                "in the closet", "near the pond", "under the slide", "in {his} bag"]
SKILLS = [("ride a bike", "rode the bike", "fell over"),
          ("swim", "swam across the pool", "sank and splashed"),
          ("whistle", "whistled a happy tune", "only blew air"),
          ("tie {his} shoes", "tied a perfect bow", "made a big knot"),
          ("jump rope", "jumped ten times in a row", "tripped on the rope"),
          ("climb the rope", "climbed all the way up", "slid back down"),
          ("catch a ball", "caught the ball", "missed the ball"),
          ("skate on the ice", "skated in a big circle", "slipped and sat down"),
          ("fly", "flew over the pond", "flapped and landed in the grass"),
          ("read a whole book", "read every page", "got stuck on a long word")]
BUILDS = ["a sand castle", "a tower of blocks", "a snowman", "a bird house", "a fort of pillows",
          "a little raft", "a bridge of sticks", "a card house"]
SCARES = [("a strange noise in the night", "it was only the wind knocking a branch on the window"),
          ("a big shadow on the wall", "it was only {his} coat hanging on the door"),
          ("the dark room", "the room was full of {his} own toys"),
          ("a loud bark behind the fence", "it was a happy old dog who wanted to play"),
          ("the thunder in the sky", "the thunder was far away and could not hurt anyone"),
          ("a scary face in the window", "it was a pumpkin with a big smile"),
          ("the deep water", "the water only came up to {his} knees"),
          ("a rustle in the bushes", "it was a tiny hedgehog looking for food")]
TOOLS = ["a long stick", "a ladder", "a rope", "a broom", "a big box to stand on", "a net"]
FIXES = ["glue", "tape", "a needle and thread", "a piece of string", "a small hammer"]

FEEL_BAD = ["sad", "upset", "worried", "cross", "scared", "grumpy", "lonely", "frustrated"]
FEEL_GOOD = ["happy", "proud", "glad", "excited", "calm", "thankful", "joyful", "warm inside"]
SAY = ["said", "asked", "shouted", "whispered", "cried", "called", "replied", "laughed"]
MORALS = ["Friends are better when they help each other.", "Trying again is how you learn.",
          "Sharing makes everyone happy.", "It is good to ask for help when you need it.",
          "Being kind is the best thing you can do.",
          "Things are not always as scary as they seem.", "Being patient brings good things.",
          "Small hands can do big things together."]

OPENINGS = ["Once upon a time, there was a {adj} {kind} named {hero}.",
            "Once upon a time, in a {place_adj} town, lived a {adj} {kind} called {hero}.",
            "There once was a {adj} {kind} named {hero} who lived {home}.",
            "{hero} was a {adj} {kind} who lived {home}.",
            "Long ago, a {adj} {kind} named {hero} lived {home}.",
            "Not far from a {place_adj} {place}, there lived a {kind} named {hero}."]
TRAITS = ["{He} loved to {hobby}.", "{His} favorite thing was {his} {color} {toy}.",
          "Every day, {he} liked to {hobby2}.",
          "{He} had a best friend, {a_fkind} named {friend}.",
          "{He} was always {adj2} and liked to {hobby}.", "{He} liked {food} more than anything."]
SETTINGS = ["{time}, {hero} went to the {place} with {friend}.",
            "{time}, {hero} and {friend} played at the {place}.",
            "{time}, {hero} took {his} {color} {toy} to the {place}, where {he} met {friend}.",
            "{time}, {hero} and {his} friend {friend} walked to the {place} to {hobby}.",
            "{time}, the sun was shining, so {hero} and {friend} ran outside to the {place}."]
DIALOGUE = ['"{line}" {hero} {say}.', '{hero} looked at {friend} and {say}, "{line}"',
            '"{line}" {said_by_friend}']
WORRIED_DIALOGUE = DIALOGUE + ['"Oh no," {hero} {say}. "{line}"']
HAPPY_LINES = ["We did it!", "Thank you so much!", "Hooray!", "You are the best friend ever!",
               "That was fun!", "Let's do it again tomorrow!"]
ENDINGS = ["{hero} and {friend} smiled. It was a good day.",
           "That night, {hero} went to bed feeling {good}.",
           "From that day on, {hero} and {friend} were the best of friends.",
           "{hero} gave {friend} a big hug. \"Thank you,\" {he} said.",
           "They laughed and played at the {place} until the sun went down.",
           "{hero} felt {good}, and {friend} felt {good2} too.",
           "When they got home, {grownup} gave everyone some {food}."]

# each plot: problem sentences, lines said, failed attempts, the idea, the resolution
PLOTS: dict[str, dict[str, list[str]]] = {
    "stuck": {
        "problem": ["Suddenly, the wind blew {his} {fly} up into {high}.",
                    "{hero} threw {his} {fly} too high, and it got stuck in {high}.",
                    "A big gust of wind took the {fly} and it landed in {high}."],
        "line": ["My {fly} is stuck!", "How will I get my {fly} down?",
                 "I can not reach it, it is too high!"],
        "fail": ["{hero} jumped and jumped, but {he} was too small.",
                 "{He} tried to climb up, but {he} slipped and fell on the grass.",
                 "{He} threw a pine cone at the {fly}, but it did not move.",
                 "{friend} tried to shake it down, but it stayed up there."],
        "idea": ["Then {friend} had an idea. \"Let's use {tool}!\"",
                 "{grownup} came by and said, \"I know! We can use {tool}.\"",
                 "{hero} thought hard. Then {he} saw {tool} by the wall."],
        "solve": ["With {tool}, they got the {fly} down at last.",
                  "They used {tool}, and the {fly} fell right into {hero}'s arms.",
                  "Slowly and carefully, they brought the {fly} down with {tool}."],
    },
    "lost": {
        "problem": ["{hero} wanted to play with {his} {toy}, but {he} could not find it.",
                    "When {hero} got home, {his} {color} {toy} was gone!",
                    "{hero} looked in {his} bag. The {toy} was not there."],
        "line": ["Where is my {toy}?", "Have you seen my {toy}?",
                 "I lost my {toy}! Can you help me?"],
        "fail": ["They looked {search1}, but it was not there.",
                 "{He} searched {search2}, but {he} found only dust.",
                 "{friend} looked {search1} and {search2}. Nothing."],
        "idea": ["Then {friend} asked, \"Where did you play with it last?\"",
                 "{grownup} said, \"Let's think. Where did you have it before lunch?\"",
                 "{hero} sat down and tried to remember."],
        "solve": ["At last, {hero} found the {toy} {lostspot}!",
                  "There it was, {lostspot}, safe and sound.",
                  "{friend} pointed {lostspot}. \"Look, there it is!\""],
    },
    "broken": {
        "problem": ["Oops! {hero} dropped {his} {toy}, and it broke into pieces.",
                    "{friend} stepped on {hero}'s {toy} by mistake, and it broke.",
                    "The {toy} fell off the shelf with a loud crash."],
        "line": ["My {toy} is broken!", "I am sorry, I did not mean to break it.",
                 "Can we fix it?"],
        "fail": ["{hero} tried to put the pieces back, but they fell apart again.",
                 "{He} pressed the pieces together, but one piece was missing.",
                 "{friend} tried to help, but the pieces did not fit."],
        "idea": ["{grownup} came in and said, \"We can fix it with {fix}.\"",
                 "Then {friend} found the missing piece under the table.",
                 "{hero} remembered that {grownup} kept {fix} in a drawer."],
        "solve": ["Together, they fixed the {toy} with {fix}. It looked almost new.",
                  "Piece by piece, they put the {toy} back together.",
                  "After a while, the {toy} was whole again."],
    },
    "scared": {
        "problem": ["That night, {hero} was scared of {scare}.",
                    "{hero} heard {scare} and hid under the blanket.",
                    "{hero} did not want to go near {scare}."],
        "line": ["I am scared!", "What is that?", "I do not like it. Please stay with me."],
        "fail": ["{He} closed {his} eyes, but {he} was still afraid.",
                 "{He} tried to sing a song, but {his} voice was shaking.",
                 "{He} counted to ten, but the fear did not go away."],
        "idea": ["{grownup} took {his} hand and said, \"Let's go and look together.\"",
                 "{friend} said, \"I will come with you. We can be brave together.\"",
                 "{hero} took a deep breath and turned on the light."],
        "solve": ["They looked, and {truth}.", "{hero} laughed, because {truth}.",
                  "It was not scary at all: {truth}."],
    },
    "skill": {
        "problem": ["{hero} wanted to {skill}, but {he} did not know how.",
                    "All the other kids could {skill}. {hero} could not.",
                    "{hero} tried to {skill}, but {he} {oops}."],
        "line": ["I will never learn to {skill}!", "It is too hard!",
                 "Can you show me how to {skill}?"],
        "fail": ["{He} tried again, and {he} {oops}.",
                 "The next day {he} tried, and {he} {oops} again.",
                 "{He} practiced all morning, but {he} still {oops}."],
        "idea": ["{grownup} said, \"Go slowly. Everyone {oops} at first.\"",
                 "{friend} said, \"Watch me. Do it one step at a time.\"",
                 "{hero} did not give up. {He} kept practicing every day."],
        "solve": ["At last, {hero} {did_skill}!", "One morning, {he} {did_skill} all by {himself}.",
                  "Then, step by step, {hero} {did_skill}. Everyone cheered."],
    },
    "share": {
        "problem": ["{hero} and {friend} both wanted the {color} {toy}.",
                    "{friend} grabbed the {toy} from {hero}, and they began to argue.",
                    "There was only one {toy}, and both friends wanted it."],
        "line": ["It is mine!", "I had it first!", "That is not fair!"],
        "fail": ["They pulled the {toy} back and forth, and nobody had fun.",
                 "{hero} went to sit alone, but it was boring without {friend}.",
                 "They stopped talking to each other, and the {place} felt very quiet."],
        "idea": ["{grownup} said, \"Why don't you take turns?\"",
                 "Then {hero} said, \"What if we play with it together?\"",
                 "{friend} said, \"I am sorry. You can go first.\""],
        "solve": ["So they took turns, and soon they were laughing again.",
                  "They played with the {toy} together, and it was twice as fun.",
                  "{hero} shared the {toy}, and {friend} shared {food}."],
    },
    "build": {
        "problem": ["{hero} and {friend} wanted to build {build}.",
                    "{hero} had a big plan: {he} would build {build}.",
                    "{hero} started to build {build} at the {place}."],
        "line": ["It will be the best one ever!", "Let's make it really big!",
                 "Help me carry this!"],
        "fail": ["But when it was half done, it fell down.", "A dog ran by and knocked it over.",
                 "The wind blew it down, and {hero} felt {bad}."],
        "idea": ["{friend} said, \"Let's make the bottom wider this time.\"",
                 "{grownup} showed them how to build it slowly and carefully.",
                 "{hero} said, \"We can try again. This time we will be careful.\""],
        "solve": ["This time, {build} stood tall and strong.",
                  "They worked together, and soon {build} was finished.",
                  "At last they finished {build}, and it was beautiful."],
    },
    "help": {
        "problem": ["At the {place}, {hero} found a little {stray} that was lost.",
                    "{hero} saw a tiny {stray} crying near the {place}.",
                    "A little {stray} sat all alone. It could not find its home."],
        "line": ["Poor little {stray}! Where is your family?",
                 "Do not be afraid. We will help you.", "Are you lost?"],
        "fail": ["They walked to the big tree, but its family was not there.",
                 "They looked by the pond, but there was no one there.",
                 "{hero} called out, but nobody answered."],
        "idea": ["Then {friend} heard a soft sound far away.",
                 "{grownup} said, \"Let's follow the little footprints.\"",
                 "{hero} gave the {stray} some {food}, and it started to walk."],
        "solve": ["Soon they found the {stray}'s family, and the {stray} ran to them.",
                  "Behind the hill, its mother was waiting. The {stray} was home!",
                  "The {stray} found its family and jumped with joy."],
    },
    "weather": {
        "problem": ["{hero} wanted to have a picnic, but it started to rain.",
                    "Dark clouds came, and rain fell on the {place}.",
                    "{hero} wanted to play outside, but the rain would not stop."],
        "line": ["Now we can not play!", "Why does it have to rain today?",
                 "Our picnic is ruined!"],
        "fail": ["{hero} waited by the window, but the rain kept falling.",
                 "{He} sang a song to make the rain stop, but it did not work.",
                 "{He} stomped {his} feet, and that did not help at all."],
        "idea": ["{grownup} said, \"We can have a picnic inside!\"",
                 "{friend} said, \"Let's put on boots and jump in puddles!\"",
                 "Then {hero} had an idea: they could build a fort of blankets."],
        "solve": ["They ate {food} on a blanket on the floor, and it was the best picnic ever.",
                  "They splashed in the puddles until they were wet and laughing.",
                  "Later the rain stopped, and a rainbow came out over the {place}."],
    },
}
STRAYS = ["duckling", "kitten", "puppy", "baby bird", "lamb", "bunny", "piglet", "fawn"]


def _article(phrase: str) -> str:
    return ("an " if phrase[0] in "aeiou" else "a ") + phrase


PRONOUN_SLOTS = ("he", "him", "his", "himself")  # template slots, filled with the hero's


def _character(rng: random.Random, taken: set[str]) -> dict[str, str]:
    while True:
        roll = rng.random()
        if roll < 0.35:
            name, kind, she = rng.choice(GIRLS), "girl", True
        elif roll < 0.7:
            name, kind, she = rng.choice(BOYS), "boy", False
        else:
            name, kind, she = rng.choice(ANIMAL_NAMES), rng.choice(ANIMALS), rng.random() < 0.5
        if name not in taken:
            taken.add(name)
            break
    pronouns = ("she", "her", "her", "herself") if she else ("he", "him", "his", "himself")
    return {"name": name, "kind": kind, **dict(zip(PRONOUN_SLOTS, pronouns, strict=True))}


def _slots(rng: random.Random) -> dict[str, str]:
    taken: set[str] = set()
    hero, friend = _character(rng, taken), _character(rng, taken)
    grownup = rng.choice(GROWN_UPS)
    skill, did_skill, oops = rng.choice(SKILLS)
    scare, truth = rng.choice(SCARES)
    s = {
        "hero": hero["name"], "kind": hero["kind"], "friend": friend["name"],
        "a_fkind": _article(friend["kind"]),
        **{key: hero[key] for key in PRONOUN_SLOTS}, "grownup": grownup,
        "grownup_lower": grownup if grownup[0].isupper() and " " in grownup else grownup.lower(),
        "adj": rng.choice(ADJ_HERO), "adj2": rng.choice(ADJ_HERO), "color": rng.choice(COLORS),
        "toy": rng.choice(TOYS), "fly": rng.choice(FLYABLE), "place": rng.choice(PLACES),
        "place_adj": rng.choice(PLACE_ADJ), "home": rng.choice(HOMES), "time": rng.choice(TIMES),
        "food": rng.choice(FOODS), "high": rng.choice(HIGH), "tool": rng.choice(TOOLS),
        "fix": rng.choice(FIXES), "build": rng.choice(BUILDS), "stray": rng.choice(STRAYS),
        "bad": rng.choice(FEEL_BAD), "good": rng.choice(FEEL_GOOD), "good2": rng.choice(FEEL_GOOD),
        "say": rng.choice(SAY), "skill": skill, "did_skill": did_skill, "oops": oops,
        "scare": scare, "truth": truth,
    }
    # Slots that themselves contain {his} etc. are filled once the pronouns are known.
    s["hobby"], s["hobby2"] = (h.format_map(s) for h in rng.sample(HOBBIES, 2))
    for key in ("skill", "truth"):
        s[key] = s[key].format_map(s)
    s["lostspot"] = rng.choice(LOST_SPOTS).format_map(s)
    s["search1"], s["search2"] = (x.format_map(s) for x in rng.sample(SEARCH_SPOTS, 2))
    s["said_by_friend"] = f"{friend['name']} {rng.choice(SAY)}."
    for key in ("he", "his"):
        s[key.capitalize()] = s[key].capitalize()
    return s


def _fill(template: str, s: dict[str, str]) -> str:
    text = template.format_map(s)
    return text[0].upper() + text[1:]


def story(rng: random.Random) -> str:
    s = _slots(rng)
    plot = PLOTS[rng.choice(sorted(PLOTS))]
    pick = rng.choice

    def say(lines: list[str], forms: list[str]) -> str:
        s["line"] = pick(lines).format_map(s)
        return pick(forms)

    intro = [pick(OPENINGS), *rng.sample(TRAITS, rng.randint(1, 2)), pick(SETTINGS)]
    trouble = [pick(plot["problem"]), say(plot["line"], WORRIED_DIALOGUE), "{hero} felt {bad}.",
               *rng.sample(plot["fail"], rng.randint(1, 2))]
    # Each sentence is filled at once because `line` changes between the two dialogues.
    trouble = [_fill(t, s) for t in trouble]
    # The idea and the resolution are written in matching order, so the turn stays coherent.
    idea = rng.randrange(len(plot["idea"]))
    turn = [plot["idea"][idea], plot["solve"][idea]]
    if rng.random() < 0.5:
        turn.append(say(HAPPY_LINES, DIALOGUE))
    ending = [pick(ENDINGS)] + ([pick(MORALS)] if rng.random() < 0.3 else [])

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
