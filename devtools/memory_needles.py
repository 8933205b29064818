"""The needle set for memory: facts planted in old conversations among everyday chatter, the later
questions that should recall them, and questions about nothing the user ever said.

Used by the needle test (tests/db/test_memory_recall.py) and the quality table of the memory benchmark
(devtools/memory_bench.py). Written for this project; each needle is a (question, reply) turn.
"""

# (conversation title, user message, assistant reply, later question)
NEEDLES = [
    (
        "Pets",
        "My cat is called Biscuit, she's a ginger tabby who hates the vacuum cleaner.",
        "Biscuit sounds like a character! Many cats fear vacuums; a slow introduction can help.",
        "What is my cat's name?",
    ),
    (
        "Dinner ideas",
        "I'm severely allergic to peanuts, so please never suggest recipes with them.",
        "Understood, I'll keep peanuts and peanut oil out of every suggestion.",
        "What food am I allergic to?",
    ),
    (
        "Family",
        "My daughter Lena turns seven on the 14th of March.",
        "Seven is a fun age! Would you like ideas for her birthday party?",
        "When is my daughter's birthday?",
    ),
    (
        "Car trouble",
        "My car is a blue Subaru Outback from 2015.",
        "A good car for snowy roads; keep the all-wheel drive serviced.",
        "What car do I drive?",
    ),
    (
        "Work",
        "My new manager at work is Priya Raman, she runs the data platform team.",
        "Congratulations on the new team! Priya's team sounds like a good place to grow.",
        "Who is my manager?",
    ),
    (
        "Cabin weekend",
        "The wifi network at our lake cabin is called PineHollow.",
        "Good to know; write the password on a card by the router for guests.",
        "What's the wifi network at the cabin called?",
    ),
    (
        "Running",
        "I'm training for the Berlin marathon in September, running four times a week.",
        "Four runs a week is a solid base; add one long run that grows each week.",
        "Which marathon am I training for?",
    ),
    (
        "Tea",
        "My favourite tea is a smoky lapsang souchong, brewed strong.",
        "Lapsang's pine-smoke flavour is distinctive; try it with a little honey.",
        "What kind of tea do I like?",
    ),
    (
        "Appointments",
        "My dentist appointment is next Tuesday at 3pm at Dr. Okafor's clinic.",
        "Noted: Tuesday 3pm with Dr. Okafor. Shall I remind you to bring your insurance card?",
        "When is my dentist appointment?",
    ),
    (
        "Childhood",
        "I grew up in Tromsø, in the far north of Norway, where winters are dark.",
        "Growing up with the polar night and northern lights must have been memorable.",
        "Where did I grow up?",
    ),
]

# Everyday turns in other conversations: what surrounds the needles.
FILLER = [
    ("Python help", "How do I read a CSV file in Python?", "Use the csv module: csv.reader(open('f.csv'))."),
    (
        "Python help",
        "What's a list comprehension?",
        "A compact way to build a list: [x*x for x in range(5)].",
    ),
    (
        "Recipes",
        "Give me a quick tomato soup recipe.",
        "Sauté onion and garlic, add tomatoes and stock, simmer, blend.",
    ),
    ("Recipes", "How long should I boil an egg?", "About 7 minutes for a jammy yolk, 10 for hard-boiled."),
    (
        "Travel",
        "What should I pack for a week in Lisbon?",
        "Light layers, comfortable shoes for hills, and a rain jacket.",
    ),
    (
        "Travel",
        "Is the train from Paris to Amsterdam fast?",
        "The direct train takes about three hours twenty minutes.",
    ),
    (
        "Writing",
        "Help me write a polite email declining a meeting.",
        "Thank them, say you can't attend, offer an alternative.",
    ),
    (
        "Writing",
        "What's a synonym for 'important'?",
        "Significant, crucial, essential or vital, depending on tone.",
    ),
    ("Math", "What is the derivative of x squared?", "The derivative of x^2 is 2x."),
    (
        "Math",
        "How do I compute a percentage increase?",
        "Subtract old from new, divide by old, multiply by 100.",
    ),
    (
        "Gardening",
        "When should I plant tulip bulbs?",
        "In autumn, about six weeks before the ground freezes.",
    ),
    (
        "Gardening",
        "Why are my basil leaves turning yellow?",
        "Often overwatering or too little light; let the soil dry a bit.",
    ),
    (
        "Movies",
        "Recommend a good science fiction film.",
        "Arrival is a thoughtful one about language and time.",
    ),
    (
        "Fitness",
        "How many push-ups should a beginner do?",
        "Start with three sets of as many as you can with good form.",
    ),
    (
        "Money",
        "What's the difference between a Roth and a traditional IRA?",
        "Roth is taxed now, traditional later.",
    ),
    (
        "Home",
        "How do I unclog a drain without chemicals?",
        "Try a plunger, then baking soda and vinegar, then a drain snake.",
    ),
]

# Questions about nothing in the history: nothing should be recalled for them.
UNRELATED = [
    "Explain how photosynthesis works.",
    "What is the capital of Australia?",
    "Write a haiku about autumn rain.",
    "How do black holes form?",
    "Translate 'good morning' into Japanese.",
    "What year did the Berlin Wall fall?",
    "How does a bicycle gear system work?",
    "Summarise the plot of Hamlet.",
]
