//! The chat screen: state and drawing, with no I/O (so it is cheap to test).

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph, Wrap};
use ratatui::Frame;

/// Most lines kept in the message pane.
const MAX_LINES: usize = 2000;

/// One line of the message pane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    /// A decrypted message.
    Message { sender: String, text: String, mine: bool },
    /// Joins, leaves, rekeys, command output.
    System(String),
    /// Rejections and errors.
    Warning(String),
}

/// Everything the screen shows.
#[derive(Debug)]
pub struct App {
    pub me: String,
    pub group: String,
    pub protocol: String,
    pub joined: bool,
    pub members: Vec<String>,
    pub epoch: Option<conclave_secure::Epoch>,
    pub fingerprint: String,
    pub status: String,
    pub input: String,
    pub entries: Vec<Entry>,
}

impl App {
    pub fn new(me: &str, group: &str, protocol: &str) -> Self {
        App {
            me: me.into(),
            group: group.into(),
            protocol: protocol.into(),
            joined: false,
            members: Vec::new(),
            epoch: None,
            fingerprint: String::new(),
            status: format!("joining #{group} ..."),
            input: String::new(),
            entries: Vec::new(),
        }
    }

    pub fn push(&mut self, e: Entry) {
        self.entries.push(e);
        if self.entries.len() > MAX_LINES {
            self.entries.drain(..self.entries.len() - MAX_LINES);
        }
    }

    pub fn system(&mut self, text: impl Into<String>) {
        self.push(Entry::System(text.into()));
    }

    pub fn warning(&mut self, text: impl Into<String>) {
        self.push(Entry::Warning(text.into()));
    }

    pub fn draw(&self, f: &mut Frame) {
        let [main, status, input] =
            Layout::vertical([Constraint::Min(3), Constraint::Length(1), Constraint::Length(3)]).areas(f.area());
        let [messages, side] = Layout::horizontal([Constraint::Min(20), Constraint::Length(26)]).areas(main);
        self.draw_messages(f, messages);
        self.draw_side(f, side);
        f.render_widget(
            Paragraph::new(self.status.as_str()).style(Style::default().fg(Color::Black).bg(Color::Cyan)),
            status,
        );
        let prompt = Line::from(vec![Span::styled("> ", Style::default().fg(Color::Cyan)), Span::raw(&self.input)]);
        let block = Block::default().borders(Borders::ALL).title(format!(" {} ", self.me));
        // Show the end of a long input.
        let width = input.width.saturating_sub(2) as usize;
        let scroll = (self.input.chars().count() + 3).saturating_sub(width) as u16;
        f.render_widget(Paragraph::new(prompt).block(block).scroll((0, scroll)), input);
        let x = input.x + 1 + (2 + self.input.chars().count() as u16 - scroll).min(input.width.saturating_sub(3));
        f.set_cursor_position((x, input.y + 1));
    }

    fn draw_messages(&self, f: &mut Frame, area: Rect) {
        let title = if self.joined { format!(" #{} ", self.group) } else { format!(" #{} (not joined) ", self.group) };
        let block = Block::default().borders(Borders::ALL).title(title);
        let height = area.height.saturating_sub(2) as usize;
        let width = area.width.saturating_sub(2).max(1) as usize;
        // Take enough trailing entries to fill the pane, counting wrapped rows.
        let mut rows = 0;
        let mut start = self.entries.len();
        while start > 0 && rows < height {
            start -= 1;
            rows += self.render(&self.entries[start]).width().div_ceil(width).max(1);
        }
        let lines: Vec<Line> = self.entries[start..].iter().map(|e| self.render(e)).collect();
        let skip = rows.saturating_sub(height) as u16;
        f.render_widget(Paragraph::new(lines).block(block).wrap(Wrap { trim: false }).scroll((skip, 0)), area);
    }

    fn render<'a>(&self, e: &'a Entry) -> Line<'a> {
        match e {
            Entry::Message { sender, text, mine } => {
                let color = if *mine { Color::Green } else { Color::Yellow };
                Line::from(vec![
                    Span::styled(sender.as_str(), Style::default().fg(color).add_modifier(Modifier::BOLD)),
                    Span::raw(": "),
                    Span::raw(text.as_str()),
                ])
            }
            Entry::System(t) => Line::styled(format!("* {t}"), Style::default().fg(Color::DarkGray)),
            Entry::Warning(t) => Line::styled(format!("! {t}"), Style::default().fg(Color::Red)),
        }
    }

    fn draw_side(&self, f: &mut Frame, area: Rect) {
        let mut lines: Vec<Line> = self
            .members
            .iter()
            .map(|m| {
                let style = if *m == self.me { Style::default().fg(Color::Green) } else { Style::default() };
                Line::styled(format!(" {m}"), style)
            })
            .collect();
        lines.push(Line::raw(""));
        let epoch = self.epoch.map_or("-".to_owned(), |e| e.to_string());
        lines.push(Line::raw(format!("epoch    {epoch}")));
        lines.push(Line::raw(format!("protocol {}", self.protocol)));
        if !self.fingerprint.is_empty() {
            lines.push(Line::raw(format!("key {}", self.fingerprint)));
        }
        let block = Block::default().borders(Borders::ALL).title(format!(" members ({}) ", self.members.len()));
        f.render_widget(Paragraph::new(lines).block(block), area);
    }
}
