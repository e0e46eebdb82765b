"""The 100 texts the MiniLM reference vectors were computed for: short and
long (past the model's 256 tokens), several languages and scripts, code,
numbers, punctuation, emoji, odd spacing."""

from __future__ import annotations

_BASE = [
    "a cat sits on the mat",
    "a kitten rests on a rug",
    "stock markets fell sharply",
    "The quick brown fox jumps over the lazy dog.",
    "How do I reset my password?",
    "What is the capital of France?",
    "Paris is the capital and most populous city of France.",
    "Berlin is the capital of Germany.",
    "I love eating pizza on Friday nights.",
    "Machine learning models need lots of data.",
    "def add(a, b):\n    return a + b",
    "SELECT name, email FROM users WHERE active = 1 ORDER BY name;",
    "for (int i = 0; i < n; ++i) { sum += v[i]; }",
    "import numpy as np; x = np.zeros((3, 4))",
    "The mitochondria is the powerhouse of the cell.",
    "Photosynthesis converts light energy into chemical energy.",
    "It was the best of times, it was the worst of times.",
    "To be, or not to be, that is the question.",
    "Call me Ishmael.",
    "The sky is blue because of Rayleigh scattering.",
    "Water boils at 100 degrees Celsius at sea level.",
    "3.14159 26535 89793 23846",
    "Order #12345 shipped on 2024-05-17 via UPS, tracking 1Z999AA10123456784.",
    "Meeting moved to 3pm tomorrow; bring the Q3 numbers.",
    "Le chat est assis sur le tapis.",
    "Der Hund spielt im Garten mit einem Ball.",
    "El perro corre en el parque.",
    "Il gatto dorme sul divano.",
    "O gato está dormindo no sofá.",
    "Кошка сидит на ковре.",
    "猫がマットの上に座っている。",
    "一只猫坐在垫子上。",
    "고양이가 매트 위에 앉아 있다.",
    "القطة تجلس على الحصيرة.",
    "बिल्ली चटाई पर बैठी है।",
    "Η γάτα κάθεται στο χαλί.",
    "I'm so happy today!!! 😀🎉",
    "🍕🍕🍕",
    "   leading and trailing spaces   ",
    "tabs\tand\nnewlines\n\nin between",
    "ALL CAPS SHOUTING TEXT HERE",
    "mIxEd CaSe TeXt",
    "hyphen-ated and under_scored words",
    "email me at someone@example.com or visit https://example.org/path?q=1",
    "C'est la vie, n'est-ce pas?",
    "Don't stop believing; hold on to that feeling.",
    "x",
    "?",
    "The weather forecast predicts heavy rain this weekend.",
    "My flight was delayed by three hours.",
    "The restaurant's new menu features seasonal vegetables.",
    "He scored the winning goal in the final minute.",
    "The novel explores themes of memory and loss.",
    "Quantum computers use qubits instead of bits.",
    "Please find the attached invoice for March.",
    "The patient reported mild headaches and fatigue.",
    "Preheat the oven to 180 degrees and grease the pan.",
    "Our quarterly revenue grew by 12 percent.",
    "The museum is closed on Mondays.",
    "She plays the violin in the city orchestra.",
]

_PARAGRAPH = (
    "Permission is hereby granted, free of charge, to any person obtaining a copy of this "
    "software and associated documentation files, to deal in the Software without restriction, "
    "including without limitation the rights to use, copy, modify, merge, publish, distribute, "
    "sublicense, and/or sell copies of the Software, and to permit persons to whom the Software "
    "is furnished to do so, subject to the following conditions. "
)

_LONG = [
    _PARAGRAPH,
    _PARAGRAPH * 2,
    _PARAGRAPH * 4,  # past 256 tokens: cut as sentence-transformers cuts it
    "word " * 300,
    " ".join(f"item{i}" for i in range(200)),
    "The history of the city goes back more than two thousand years. " * 12,
]

_PAIRS = [f"Question {i}: what is {i} plus {i + 1}? The answer is {2 * i + 1}." for i in range(10)]
_TOPICS = [
    f"A short note about {topic}, written for a newsletter."
    for topic in ("gardening", "astronomy", "tax law", "jazz", "volcanoes", "chess", "knitting",
                  "rust programming", "ancient rome", "deep sea fish", "bread baking", "marathons",
                  "ballet", "solar panels", "bird migration", "cryptography", "tea ceremonies",
                  "skateboarding", "glaciers", "opera", "robotics", "mushrooms", "sailing", "origami")
]

TEXTS: list[str] = (_BASE + _LONG + _PAIRS + _TOPICS)[:100]
assert len(TEXTS) == 100, len(TEXTS)

RERANK_QUERY = "how do plants turn sunlight into energy"
RERANK_DOCUMENTS = [
    "Photosynthesis converts light energy into chemical energy stored in sugars.",
    "The stock market closed higher on Tuesday.",
    "Chlorophyll absorbs mostly blue and red light.",
    "My cat likes to sleep in the sun.",
    "Solar panels turn sunlight into electricity.",
    "A recipe for banana bread with walnuts.",
    "Plants need water, carbon dioxide and light to grow.",
    "The train to Berlin leaves at nine.",
    "Energy drinks contain a lot of caffeine.",
    "Leaves are green because they reflect green light.",
]
