//! The terminal screen: the input line (tui-input), its history, the
//! scrollback position, and drawing the chat model. No I/O (so it is cheap
//! to test).

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers, MouseEvent, MouseEventKind};
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph, Wrap};
use ratatui::Frame;
use tui_input::{Input, InputRequest};

use super::model::{Chat, Entry, KeyState};

/// Most lines kept in the input history.
const MAX_HISTORY: usize = 500;

/// What a key asks of the chat.
#[derive(Debug, PartialEq, Eq)]
pub enum Action {
    /// Nothing beyond redrawing.
    None,
    /// A line to submit.
    Submit(String),
    /// Ctrl-C (or Ctrl-D on an empty line).
    Quit,
}

/// The terminal's own state: input line, history, scrollback.
#[derive(Debug, Default)]
pub struct Screen {
    pub input: Input,
    history: Vec<String>,
    /// Position in `history` while browsing it (Up/Down); `history.len()` is the line being typed.
    hist_pos: usize,
    /// The line being typed when browsing began.
    draft: String,
    /// Rows scrolled back from the newest (0: following new messages).
    pub scroll: usize,
    /// Rows of the message pane at the last draw (for PgUp/PgDn).
    page: usize,
}

impl Screen {
    pub fn on_key(&mut self, k: KeyEvent) -> Action {
        let ctrl = k.modifiers.contains(KeyModifiers::CONTROL);
        let req = match k.code {
            KeyCode::Char('c') if ctrl => return Action::Quit,
            KeyCode::Char('d') if ctrl && self.input.value().is_empty() => return Action::Quit,
            KeyCode::Enter => {
                let line = self.input.value_and_reset();
                if !line.trim().is_empty() && self.history.last() != Some(&line) {
                    self.history.push(line.clone());
                    if self.history.len() > MAX_HISTORY {
                        self.history.remove(0);
                    }
                }
                self.hist_pos = self.history.len();
                self.draft.clear();
                self.scroll = 0;
                return Action::Submit(line);
            }
            KeyCode::Up => {
                self.browse(-1);
                return Action::None;
            }
            KeyCode::Down => {
                self.browse(1);
                return Action::None;
            }
            KeyCode::PageUp => {
                self.scroll = self.scroll.saturating_add(self.page.max(2) - 1);
                return Action::None;
            }
            KeyCode::PageDown => {
                self.scroll = self.scroll.saturating_sub(self.page.max(2) - 1);
                return Action::None;
            }
            KeyCode::Char('a') if ctrl => InputRequest::GoToStart,
            KeyCode::Char('e') if ctrl => InputRequest::GoToEnd,
            KeyCode::Char('u') if ctrl => InputRequest::DeleteLine,
            KeyCode::Char('k') if ctrl => InputRequest::DeleteTillEnd,
            KeyCode::Char('w') if ctrl => InputRequest::DeletePrevWord,
            KeyCode::Char(_) if ctrl => return Action::None,
            KeyCode::Char(c) => InputRequest::InsertChar(c),
            KeyCode::Backspace => InputRequest::DeletePrevChar,
            KeyCode::Delete => InputRequest::DeleteNextChar,
            KeyCode::Left if ctrl => InputRequest::GoToPrevWord,
            KeyCode::Right if ctrl => InputRequest::GoToNextWord,
            KeyCode::Left => InputRequest::GoToPrevChar,
            KeyCode::Right => InputRequest::GoToNextChar,
            KeyCode::Home => InputRequest::GoToStart,
            KeyCode::End => InputRequest::GoToEnd,
            // Esc no longer quits (too easy to hit by accident): /quit or Ctrl-C.
            _ => return Action::None,
        };
        self.input.handle(req);
        Action::None
    }

    pub fn on_mouse(&mut self, m: MouseEvent) {
        match m.kind {
            MouseEventKind::ScrollUp => self.scroll = self.scroll.saturating_add(3),
            MouseEventKind::ScrollDown => self.scroll = self.scroll.saturating_sub(3),
            _ => {}
        }
    }

    /// Up (-1) or Down (+1) through the history.
    fn browse(&mut self, step: isize) {
        if self.hist_pos == self.history.len() {
            if step > 0 {
                return;
            }
            self.draft = self.input.value().to_owned();
        }
        let pos = self.hist_pos as isize + step;
        if pos < 0 || pos as usize > self.history.len() {
            return;
        }
        self.hist_pos = pos as usize;
        let line = self.history.get(self.hist_pos).cloned().unwrap_or_else(|| self.draft.clone());
        self.input = Input::new(line);
    }

    pub fn draw(&mut self, f: &mut Frame, chat: &Chat) {
        let [main, status, input] =
            Layout::vertical([Constraint::Min(3), Constraint::Length(1), Constraint::Length(3)]).areas(f.area());
        let [messages, side] = Layout::horizontal([Constraint::Min(20), Constraint::Length(26)]).areas(main);
        self.draw_messages(f, chat, messages);
        draw_side(f, chat, side);
        let (text, style) = match chat.key {
            KeyState::Waiting | KeyState::Aside { .. } => {
                (chat.status.as_str(), Style::default().fg(Color::Black).bg(Color::Yellow))
            }
            _ => (chat.status.as_str(), Style::default().fg(Color::Black).bg(Color::Cyan)),
        };
        f.render_widget(Paragraph::new(text).style(style), status);
        let width = input.width.saturating_sub(4).max(1) as usize;
        let scroll = self.input.visual_scroll(width);
        let prompt =
            Line::from(vec![Span::styled("> ", Style::default().fg(Color::Cyan)), Span::raw(self.input.value())]);
        let block = Block::default().borders(Borders::ALL).title(format!(" {} ", chat.me));
        // The prompt stays; the text scrolls to keep the cursor in view.
        f.render_widget(Paragraph::new(prompt).block(block).scroll((0, scroll as u16)), input);
        let x = input.x + 3 + (self.input.visual_cursor().saturating_sub(scroll)) as u16;
        f.set_cursor_position((x.min(input.right().saturating_sub(2)), input.y + 1));
    }

    fn draw_messages(&mut self, f: &mut Frame, chat: &Chat, area: Rect) {
        let height = area.height.saturating_sub(2) as usize;
        let width = area.width.saturating_sub(2).max(1);
        self.page = height;
        let lines: Vec<Line> = chat.entries.iter().map(|e| render(chat, &e.entry)).collect();
        let para = Paragraph::new(lines).wrap(Wrap { trim: false });
        let rows = para.line_count(width);
        let bottom = rows.saturating_sub(height);
        self.scroll = self.scroll.min(bottom);
        let top = bottom - self.scroll;
        let mut title =
            if chat.joined { format!(" #{} ", chat.group) } else { format!(" #{} (not joined) ", chat.group) };
        if self.scroll > 0 {
            title.push_str(&format!("[scrollback: {} lines below, PgDn] ", self.scroll));
        }
        let block = Block::default().borders(Borders::ALL).title(title);
        f.render_widget(para.block(block).scroll((top.min(u16::MAX as usize) as u16, 0)), area);
    }
}

fn render<'a>(chat: &Chat, e: &'a Entry) -> Line<'a> {
    match e {
        Entry::Message { sender, text, mine } => {
            let color = if *mine || *sender == chat.me { Color::Green } else { Color::Yellow };
            Line::from(vec![
                Span::styled(sender.as_str(), Style::default().fg(color).add_modifier(Modifier::BOLD)),
                Span::raw(": "),
                Span::raw(text.as_str()),
            ])
        }
        Entry::Rekey(t) => Line::styled(format!("* {t}"), Style::default().fg(Color::Cyan)),
        Entry::System(t) => Line::styled(format!("* {t}"), Style::default().fg(Color::DarkGray)),
        Entry::Warning(t) => Line::styled(format!("! {t}"), Style::default().fg(Color::Red)),
    }
}

fn draw_side(f: &mut Frame, chat: &Chat, area: Rect) {
    let roster = chat.roster();
    let mut lines: Vec<Line> = roster
        .iter()
        .map(|&(m, waiting)| match waiting {
            // In the view, not yet in the key: SEAL's wait for the next rekey.
            true => Line::styled(format!(" {m} (waits for rekey)"), Style::default().fg(Color::Yellow)),
            false if m == chat.me => Line::styled(format!(" {m}"), Style::default().fg(Color::Green)),
            false => Line::raw(format!(" {m}")),
        })
        .collect();
    lines.push(Line::raw(""));
    let epoch = chat.epoch().map_or("-".to_owned(), |e| e.to_string());
    lines.push(Line::raw(format!("epoch    {epoch}")));
    lines.push(Line::raw(format!("protocol {}", chat.protocol)));
    match &chat.key {
        KeyState::Keyed { fingerprint, .. } => lines.push(Line::raw(format!("key {fingerprint}"))),
        KeyState::Waiting => lines.push(Line::styled("waiting for key ...", Style::default().fg(Color::Yellow))),
        KeyState::Aside { .. } => lines.push(Line::styled("no key: standing aside", Style::default().fg(Color::Red))),
        KeyState::NotJoined => lines.push(Line::raw("no key")),
    }
    let block = Block::default().borders(Borders::ALL).title(format!(" members ({}) ", roster.len()));
    f.render_widget(Paragraph::new(lines).block(block).wrap(Wrap { trim: false }), area);
}
