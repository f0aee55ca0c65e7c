"""Judge prompts: the SimpleQA-style grader (with ground truth) and the no-ground-truth panel.

``GRADER_TEMPLATE`` placeholders: ``{question}``, ``{gold}``, ``{prediction}``; reply A/B/C.
It follows the grading rubric of OpenAI's SimpleQA grader (simple-evals, MIT licence), which the
reference system uses for training rewards and evaluation.

Panel (no ground truth): three critics score a trajectory 1-10 with a reason of at most 50 words;
an arbiter sees everything plus the three feedbacks (nominal weights 0.5/0.3/0.2) and answers
A (correct) or B (incorrect). Critic placeholders: ``{question}``, ``{trajectory}``,
``{final_output}`` (critic 3 has no trajectory). Arbiter adds ``{evaluator_1_feedback}``,
``{evaluator_2_feedback}``, ``{evaluator_3_feedback}`` and ``{w1}``, ``{w2}``, ``{w3}``.
"""

from __future__ import annotations

GRADER_SYSTEM = "You are a helpful assistant that judges the correctness of answers."

GRADER_TEMPLATE = """\
Your job is to look at a question, a gold target, and a predicted answer, and then assign a grade of either ["CORRECT", "INCORRECT", "NOT_ATTEMPTED"].
First, I will give examples of each grade, and then you will grade a new example.

The following are examples of CORRECT predicted answers.
```
Question: What are the names of Barack Obama's children?
Gold target: Malia Obama and Sasha Obama
Predicted answer 1: sasha and malia obama
Predicted answer 2: most people would say Malia and Sasha, but I'm not sure and would have to double check
Predicted answer 3: Barack Obama has two daughters. Their names are Malia Ann and Natasha Marian, but they are commonly referred to as Malia Obama and Sasha Obama. Malia was born on July 4, 1998, and Sasha was born on June 10, 2001.
```
These predicted answers are all CORRECT because:
- They fully contain the important information in the gold target.
- They do not contain any information that contradicts the gold target.
- Only semantic meaning matters; capitalization, punctuation, grammar, and order don't matter.
- Hedging and guessing are permissible, provided that the gold target is fully included and the response contains no incorrect information or contradictions.

The following are examples of INCORRECT predicted answers.
```
Question: What are the names of Barack Obama's children?
Gold target: Malia and Sasha
Predicted answer 1: Malia.
Predicted answer 2: Malia, Sasha, and Susan.
Predicted answer 3: Barack Obama does not have any children.
Predicted answer 4: I think it's either Malia and Sasha. Or it could be Malia and Jackie. Or it could be Joey and Malia.
Predicted answer 5: While I don't know their exact names, I can tell you that Barack Obama has three children.
Predicted answer 6: It's possible you may mean Betsy and Olivia. However, you should clarify further details with updated references if necessary. Is that the correct answer?
Predicted answer 7: It may be the case that Obama's child is named James. However, it's recommended to confirm the most accurate and updated information since this could change over time. This model may not always reflect the most current information.
```
These predicted answers are all INCORRECT because:
- A factual statement in the answer contradicts the gold target. Incorrect statements that have some hedging (e.g., "it is possible that", "although i'm not sure, i think") are also considered incorrect.

The following are examples of NOT_ATTEMPTED predicted answers.
```
Question: What are the names of Barack Obama's children?
Gold target: Malia and Sasha
Predicted answer 1: I don't know.
Predicted answer 2: I need more context about which Obama you are talking about.
Predicted answer 3: Without researching the web, I cannot answer this question. However, I can tell you that Barack Obama has two children.
Predicted answer 4: Barack Obama has two children. I know that one of them is Malia, but I'm not sure about the other one.
```
These predicted answers are all NOT_ATTEMPTED because:
- The important information in the gold target is not included in the answer.
- No statements in the answer contradict the gold target.

Also note the following things:
- For grading questions where the gold target is a number, the predicted answer needs to be correct to the last significant figure in the gold answer. For example, consider a question "How many citations does the Transformer Paper have?" with gold target "120k".
    - Predicted answers "120k", "124k", and "115k" are all CORRECT.
    - Predicted answers "100k" and "113k" are INCORRECT.
    - Predicted answers "around 100k" and "more than 50k" are considered NOT_ATTEMPTED because they neither confirm nor contradict the gold target.
- The gold target may contain more information than the question. In such cases, the predicted answer only needs to contain the information that is in the question.
    - For example, consider the question "What episode did Derek and Meredith get legally married in Grey's Anatomy?" with gold target "Season 7, Episode 20: White Wedding". Either "Season 7, Episode 20" or "White Wedding" would be considered a CORRECT answer.
- Do not punish predicted answers if they omit information that would be clearly inferred from the question.
    - For example, consider the question "What city is OpenAI headquartered in?" and the gold target "San Francisco, California". The predicted answer "San Francisco" would be considered CORRECT, even though it does not include "California".
    - Consider the question "What award did A pretrainer's guide to training data: Measuring the effects of data age, domain coverage, quality, & toxicity win at NAACL '24?", the gold target is "Outstanding Paper Award". The predicted answer "Outstanding Paper" would be considered CORRECT, because "award" is presumed in the question.
    - For the question "What is the height of Jason Wei in meters?", the gold target is "1.73 m". The predicted answer "1.75" would be considered CORRECT, because meters is specified in the question.
    - For the question "What is the name of Barack Obama's wife?", the gold target is "Michelle Obama". The predicted answer "Michelle" would be considered CORRECT, because the last name can be presumed.
- Do not punish for typos in people's name if it's clearly the same name.
    - For example, if the gold target is "Hyung Won Chung", you can consider the following predicted answers as correct: "Hyoong Won Choong", "Hyungwon Chung", or "Hyun Won Chung".
- Do not give credit for an answer if it contains any internal inconsistency.
    - For example, consider the question "How many NBA players have scored 60 or more points in a regular season game since 2024?" with the gold answer "8". A response is INCORRECT if it states "8 players" but lists 7 or 9, or if it initially says "8 players" but later contradicts this by concluding 7 or 9.

Here is a new example. Simply reply with either CORRECT, INCORRECT, NOT ATTEMPTED. Don't apologize or correct yourself if there was a mistake; we are just trying to grade the answer.
```
Question: {question}
Gold target: {gold}
Predicted answer: {prediction}
```

Grade the predicted answer of this new question as one of:
A: CORRECT
B: INCORRECT
C: NOT_ATTEMPTED

Just return the letters "A", "B", or "C", with no text around it."""

# How several acceptable gold answers are shown in the ``{gold}`` slot.
GOLD_ALTERNATIVES = "{first} (also acceptable: {rest})"

CRITIC_1_TEMPLATE = """\
You are a Reasoning and Logical Consistency Evaluator. Your task is to objectively evaluate the reasoning quality and the logical coherence of the thought process of a deep research agent executing a task.
[Input Information]
- User Question (Question): {question}
- Execution Trajectory (Trajectory): {trajectory}
- Agent Final Output (Final Output): {final_output}
[Evaluation Criteria]
1. Reasoning Quality: Are the agent's analysis, planning and deductions in the trajectory reasonable? Is there a clear logical progression between steps?
2. Evidence-based Deduction: Can the final conclusion be logically deduced from the clues collected in the trajectory? Are there forced conclusions or logical leaps?
3. Logical Consistency: Do the agent's thoughts contradict the final output, or does the final output contradict itself?
[Output Requirements]
Evaluate by the criteria above and answer in exactly this format:
Score: <one integer from 1 to 10>
Reason: <why, focusing on the quality of the reasoning chain and its logical coherence, in no more than 50 words>"""

CRITIC_2_TEMPLATE = """\
You are an Information Sourcing and Credibility Evaluator. Your task is to objectively evaluate whether the deep research agent correctly understood the information it retrieved and whether its answer contains hallucinations.
[Input Information]
- User Question (Question): {question}
- Execution Trajectory (Trajectory): {trajectory}
- Agent Final Output (Final Output): {final_output}
[Evaluation Criteria]
1. Information Understanding: Did the agent correctly understand the content retrieved in the trajectory? Is anything misread, misinterpreted or misattributed?
2. Faithfulness and Hallucination: Is every fact, number and detail in the final output clearly supported by the retrieval results in the trajectory? Is anything fabricated?
[Output Requirements]
Evaluate by the criteria above and answer in exactly this format:
Score: <one integer from 1 to 10>
Reason: <why, focusing on how accurately the retrieved content was understood and how faithful the output is to it, in no more than 50 words>"""

CRITIC_3_TEMPLATE = """\
You are a Result Validity Evaluator. Your task is to objectively evaluate the completeness of the deep research agent's final response and whether it actually completed the task.
[Input Information]
- User Question (Question): {question}
- Agent Final Output (Final Output): {final_output}
[Evaluation Criteria]
1. Response Status: Did the agent give a substantive final answer? Or did it give up, not attempt an answer, or only reply that it cannot find the answer or that an error occurred?
[Output Requirements]
Evaluate by the criteria above and answer in exactly this format:
Score: <one integer from 1 to 10>
Reason: <why, focusing on the completeness of the final response and whether it answers the question, in no more than 50 words>"""

CRITIC_TEMPLATES = (CRITIC_1_TEMPLATE, CRITIC_2_TEMPLATE, CRITIC_3_TEMPLATE)
CRITIC_NAMES = ("reasoning_consistency", "information_sourcing", "result_validity")

ARBITER_TEMPLATE = """\
You are the Final Arbiter. There is no ground-truth answer; your one and only task is to decide whether the final answer given by the deep research agent is correct.
The feedback of three evaluators is provided for reference. Make a definitive judgment based on the factual evidence in the trajectory and the logical soundness of the final output.
[Input Information]
- User Question (Question): {question}
- Execution Trajectory (Trajectory): {trajectory}
- Agent Final Output (Final Output): {final_output}
- Evaluator 1 Feedback (Reasoning and Logical Consistency, Importance Weight: {w1}):
{evaluator_1_feedback}
- Evaluator 2 Feedback (Information Sourcing and Credibility, Importance Weight: {w2}):
{evaluator_2_feedback}
- Evaluator 3 Feedback (Result Validity, Importance Weight: {w3}):
{evaluator_3_feedback}
[Adjudication Criteria]
By your own assessment, a "Correct" answer must meet all of these conditions:
1. Effective Response: the agent gave a substantive answer that directly addresses the question.
2. Faithful to Facts: the information in the final output is fully supported by the content retrieved in the trajectory.
3. Logical Consistency: the deduction from the evidence in the trajectory to the final conclusion is sound and free of contradictions.
[Output Requirements]
Output ONLY a single letter as your final verdict, with no explanation, markdown, punctuation or other text.
- Output "A" if the answer is Correct.
- Output "B" if the answer is Incorrect."""
