"""Built-in text: the multilingual filler prompts and the tokenizer's training corpus.

Fillers are the other requests sharing the batch with the target. They are varied on
purpose (languages, scripts, code) so the batch looks like real traffic.
"""

FILLERS: tuple[str, ...] = (
    "The history of the printing press begins in the fifteenth century, when movable type changed how books were made.",
    "La photosynthèse permet aux plantes de transformer la lumière du soleil en énergie chimique.",
    "Der schnelle braune Fuchs springt über den faulen Hund, während die Sonne langsam untergeht.",
    "El río Amazonas atraviesa varios países de América del Sur y alberga una enorme biodiversidad.",
    "東京は日本の首都であり、世界で最も人口の多い都市圏の一つです。",
    "Москва — столица России, крупнейший по численности населения город страны.",
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a",
    "Il Rinascimento italiano ha prodotto artisti come Leonardo da Vinci e Michelangelo Buonarroti.",
    "北京是中国的首都，有着三千多年的建城史和八百多年的建都史。",
    "O oceano Atlântico separa as Américas da Europa e da África.",
    "SELECT name, count(*) FROM orders GROUP BY name HAVING count(*) > 10 ORDER BY 2 DESC;",
    "Η Ακρόπολη της Αθήνας είναι ένα από τα πιο γνωστά μνημεία του αρχαίου κόσμου.",
    "Explain why the sky is blue in two sentences, using the word scattering.",
    "서울은 대한민국의 수도이며 한강을 중심으로 발전한 도시입니다.",
    "Write a haiku about autumn leaves falling into a quiet river at dusk.",
    "Tell me about Richard Feynman and his work on quantum electrodynamics.",
)

# The targets `nondet probe` replays when no prompt is given. Several prompts, because whether
# a batch-variant logprob turns into a different token depends on the host's kernels and on
# the trajectory: on one CPU a prompt flips at step 93, on another the same prompt needs 266
# steps, while other prompts flip within 200. Each prompt is diffed against itself alone.
DEMO_PROMPTS: tuple[str, ...] = (
    "Tell me about Richard Feynman",
    "The history of the printing press",
    "La photosynthèse permet aux plantes",
    "Der schnelle braune Fuchs springt",
    "El río Amazonas atraviesa",
    "東京は日本の首都であり",
    "Москва — столица России",
    "def fibonacci(n):",
)

# Extra text the embedded tokenizer is trained on, so common English words become tokens.
TRAINING_TEXT: tuple[str, ...] = (
    "Tell me about Richard Feynman. Richard Feynman was an American theoretical physicist, "
    "born in Queens, New York City, known for his work in quantum electrodynamics, the path "
    "integral formulation of quantum mechanics, and the physics of superfluidity.",
    "Batch invariance means that the numbers computed for one request do not depend on how "
    "many other requests share the batch. Kernels that split a reduction differently for "
    "different batch sizes break it, and greedy decoding then picks different tokens.",
    "The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with "
    "a single step. To be or not to be, that is the question.",
    "Machine learning models are trained on data and evaluated on held-out examples. The "
    "model predicts the next token given all previous tokens in the sequence.",
)
